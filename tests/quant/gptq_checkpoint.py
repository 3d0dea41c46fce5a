"""Make GPTQ-format checkpoints of a real HF model for the brigade-gptq tests, with no AutoGPTQ and no hub.

``write_gptq_checkpoint`` quantizes every decoder projection (q, k, v, o, gate, up, down) by round-to-nearest
per group with GPTQ's own quantizer rules (``Quantizer.find_params`` of the GPTQ reference code, Frantar et al.
2022: the range always includes 0; symmetric ranges are ``[-max|w|, max|w|]`` with zero ``2**(bits-1)``), skipping
GPTQ's error-feedback update, which changes which codes are chosen but not the format. With ``desc_act`` the
rows are grouped in a random order (real GPTQ orders them by the Hessian's diagonal, which q/k/v and gate/up
share because they read the same input, so they share the permutation here too), giving a permuted ``g_idx``.

Packing copies AutoGPTQ's ``QuantLinear.pack`` (numpy uint32 words, loops over rows and columns, zeros stored
minus one for ``checkpoint_format: "gptq"``) and is independent of ``brigade_gptq.packing``, so a shared
mistake in both cannot hide. The same codes, zeros and fp16 scales, dequantized in float32, go into an ordinary
checkpoint (``write_dequantized_checkpoint``) that HF transformers runs as the reference.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# Projections that read the same input share the act-order permutation (the same Hessian).
_INPUT_OF = {"self_attn.q_proj": "attn_in", "self_attn.k_proj": "attn_in", "self_attn.v_proj": "attn_in",
             "self_attn.o_proj": "attn_out", "mlp.gate_proj": "mlp_in", "mlp.up_proj": "mlp_in",
             "mlp.down_proj": "mlp_mid"}


@dataclass(frozen=True)
class GPTQSpec:
    """One checkpoint flavour: bits (4/8), group_size (-1 or > 0), desc_act, sym, checkpoint_format."""

    bits: int
    group_size: int
    desc_act: bool
    sym: bool
    checkpoint_format: str = "gptq"

    @property
    def id(self) -> str:
        return (f"{self.bits}bit-g{self.group_size}-{'act' if self.desc_act else 'noact'}-"
                f"{'sym' if self.sym else 'asym'}" + ("" if self.checkpoint_format == "gptq" else "-v2"))

    def quantization_config(self) -> dict:
        """config.json's ``quantization_config``, as AutoGPTQ writes it (transformers copies it there)."""
        return {"quant_method": "gptq", "bits": self.bits, "group_size": self.group_size, "desc_act": self.desc_act,
                "sym": self.sym, "static_groups": False, "true_sequential": True, "damp_percent": 0.01,
                "checkpoint_format": self.checkpoint_format}


@dataclass
class QuantizedLinear:
    """One layer's GPTQ quantization. q [in, out] uint8 codes; zeros [groups, out] int64 (true zero points);
    scales [groups, out] float16; g_idx [in] int32."""

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor

    def dequantized(self) -> torch.Tensor:
        """The weight as the checkpoint means it: [out, in] float32, ``(q - zero) * scale`` per row's group."""
        g = self.g_idx.long()
        return ((self.q.long() - self.zeros[g]).float() * self.scales.float()[g]).T.contiguous()


def quantize_rtn(weight: torch.Tensor, spec: GPTQSpec, perm: torch.Tensor | None = None) -> QuantizedLinear:
    """Round-to-nearest GPTQ quantization of ``weight`` [out, in] (any float dtype).

    ``perm`` (act-order): the order in which input rows are grouped; row ``perm[i]`` belongs to group
    ``i // group_size`` (AutoGPTQ's ``g_idx`` with ``desc_act``). Groups: ``ceil(in / group_size)``.
    """
    w = weight.float().T.contiguous()  # [in, out], as GPTQ walks the input rows
    rows = w.shape[0]
    maxq = 2 ** spec.bits - 1
    gs = rows if spec.group_size == -1 else spec.group_size
    order = torch.arange(rows) if perm is None else perm
    g_idx = torch.empty(rows, dtype=torch.int32)
    g_idx[order] = (torch.arange(rows) // gs).to(torch.int32)
    groups = -(-rows // gs)
    zeros = torch.empty(groups, w.shape[1], dtype=torch.int64)
    scales = torch.empty(groups, w.shape[1], dtype=torch.float16)
    q = torch.empty(rows, w.shape[1], dtype=torch.uint8)
    for g in range(groups):
        sel = (g_idx == g).nonzero().squeeze(1)
        block = w[sel]  # [rows of the group, out]
        xmin = torch.minimum(block.min(0).values, torch.zeros(1))
        xmax = torch.maximum(block.max(0).values, torch.zeros(1))
        if spec.sym:
            xmax = torch.maximum(xmin.abs(), xmax)
            xmin = torch.where(xmin < 0, -xmax, xmin)
        both0 = (xmin == 0) & (xmax == 0)
        xmin, xmax = torch.where(both0, -1.0, xmin), torch.where(both0, 1.0, xmax)
        scale = ((xmax - xmin) / maxq).half()
        if spec.sym:
            zero = torch.full_like(xmin, (maxq + 1) // 2, dtype=torch.int64)
        else:
            zero = torch.round(-xmin / scale.float()).to(torch.int64)
            if spec.checkpoint_format == "gptq":
                # v1 stores zero - 1, and AutoGPTQ's uint32 packing of -1 would spill into the next columns'
                # fields, so a v1 checkpoint cannot hold zero 0 (a group with no negative weight): use 1.
                zero = zero.clamp(1, maxq)
        zeros[g], scales[g] = zero, scale
        q[sel] = torch.clamp(torch.round(block / scale.float()) + zero, 0, maxq).to(torch.uint8)
    return QuantizedLinear(q=q, zeros=zeros, scales=scales, g_idx=g_idx)


def autogptq_pack(layer: QuantizedLinear, spec: GPTQSpec) -> dict[str, torch.Tensor]:
    """``qweight``, ``qzeros``, ``scales``, ``g_idx`` packed as AutoGPTQ's ``QuantLinear.pack`` does."""
    bits, per_word = spec.bits, 32 // spec.bits
    intweight = layer.q.numpy().astype(np.uint32)  # [in, out]
    # AutoGPTQ's QuantLinear refuses other sizes; its ``shape // 32 * bits`` word counts rely on it.
    assert intweight.shape[0] % 32 == 0 and intweight.shape[1] % 32 == 0, intweight.shape
    qweight = np.zeros((intweight.shape[0] // 32 * bits, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + per_word):
            qweight[row] |= intweight[j] << (bits * (j - i))
        i += per_word
        row += 1
    stored = layer.zeros.numpy() - (1 if spec.checkpoint_format == "gptq" else 0)
    assert stored.min() >= 0, "a v1 zero of 0 would be stored as -1"
    zeros = stored.astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 32 * bits), dtype=np.uint32)
    i = col = 0
    while col < qzeros.shape[1]:
        for j in range(i, i + per_word):
            qzeros[:, col] |= zeros[:, j] << (bits * (j - i))
        i += per_word
        col += 1
    return {"qweight": torch.from_numpy(qweight.view(np.int32).copy()),
            "qzeros": torch.from_numpy(qzeros.view(np.int32).copy()),
            "scales": layer.scales.clone(), "g_idx": layer.g_idx.clone()}


def _read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def _copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer, chat template, generation config: everything but the weights and config.json."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json" \
                and not path.name.startswith("."):
            shutil.copy(path, dst / path.name)


def quantize_model(model_dir: Path, spec: GPTQSpec, *, seed: int = 0) -> tuple[dict, dict[str, QuantizedLinear]]:
    """Read ``model_dir`` and quantize its projections. Returns (all original tensors, {projection: layer})."""
    tensors = _read_checkpoint(model_dir)
    gen = torch.Generator().manual_seed(seed)
    layers: dict[str, QuantizedLinear] = {}
    perms: dict[tuple[str, str], torch.Tensor] = {}
    for name in sorted(tensors):
        prefix, _, leaf = name.rpartition(".")
        proj = next((p for p in PROJECTIONS if prefix.endswith(p)), None)
        if proj is None or leaf != "weight":
            continue
        perm = None
        if spec.desc_act:
            key = (prefix[:-len(proj)], _INPUT_OF[proj])
            if key not in perms:
                perms[key] = torch.randperm(tensors[name].shape[1], generator=gen)
            perm = perms[key]
        layers[prefix] = quantize_rtn(tensors[name], spec, perm)
    return tensors, layers


def write_gptq_checkpoint(model_dir: Path, out_dir: Path, spec: GPTQSpec, *, seed: int = 0,
                          layers: tuple[dict, dict[str, QuantizedLinear]] | None = None) -> Path:
    """Write a GPTQ checkpoint of ``model_dir`` to ``out_dir``: model.safetensors (packed projections, the rest
    as it was), config.json with ``quantization_config``, tokenizer files. Returns ``out_dir``."""
    tensors, quantized = layers or quantize_model(model_dir, spec, seed=seed)
    packed = {prefix: autogptq_pack(layer, spec) for prefix, layer in quantized.items()}
    return write_packed_checkpoint(model_dir, out_dir, tensors, packed, spec.quantization_config())


def write_packed_checkpoint(model_dir: Path, out_dir: Path, tensors: dict[str, torch.Tensor],
                            packed: dict[str, dict[str, torch.Tensor]], quantization_config: dict) -> Path:
    """Write a quantized checkpoint of ``model_dir`` to ``out_dir`` (GPTQ's and AWQ's writers): each
    ``{prefix}.weight`` named in ``packed`` replaced by that projection's packed tensors (``{prefix}.qweight``, ...),
    the other ``tensors`` as they were, config.json with ``quantization_config``, tokenizer files. Returns
    ``out_dir``."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        prefix = name.rpartition(".")[0]
        if prefix in packed and name.endswith(".weight"):
            for key, value in packed[prefix].items():
                out[f"{prefix}.{key}"] = value
        else:
            out[name] = tensor
    _copy_side_files(model_dir, out_dir)
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def write_dequantized_checkpoint(model_dir: Path, out_dir: Path,
                                 layers: tuple[dict, dict[str, QuantizedLinear]]) -> Path:
    """Write the reference: the same checkpoint with every projection's weight replaced by its dequantized
    float32 matrix (other tensors unchanged) and no quantization_config. Returns ``out_dir``."""
    tensors, quantized = layers
    out = {name: (quantized[name.rpartition(".")[0]].dequantized()
                  if name.rpartition(".")[0] in quantized and name.endswith(".weight") else tensor)
           for name, tensor in tensors.items()}
    _copy_side_files(model_dir, out_dir)
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(model_dir / "config.json", out_dir / "config.json")
    return out_dir


# The two end-to-end flavours of test_gptq_model.py (between them: 4 and 8 bits, group 128 and -1, act-order on and
# off, asymmetric and symmetric).
E2E_SPECS = (GPTQSpec(bits=4, group_size=128, desc_act=True, sym=False),
             GPTQSpec(bits=8, group_size=-1, desc_act=False, sym=True))
