"""FP8 checkpoints for the tests, written the way users get them.

* ``compressed_tensors_checkpoint``: the compressed-tensors library's own path (what llm-compressor runs inside:
  ``apply_quantization_config`` puts the scheme's scale parameters on every targeted ``Linear``, the scales are
  computed with the library's ``calculate_qparams`` from the weights' (and, for static schemes, a calibration
  pass's input) min/max, and ``ModelCompressor`` compresses the weights to float8 and writes ``config.json``'s
  ``quantization_config``), for the tests that run where llm-compressor is not installed (the GPU image).
* ``llm_compressor_checkpoint``: the same formats written by llm-compressor itself (the test extra
  ``llmcompressor``), the tool users make them with.
* ``fp8_checkpoint``: ``quant_method: "fp8"`` checkpoints (per-tensor ``weight_scale`` with optional static
  ``input_scale``, or 128x128 blocks with ``weight_scale_inv``), written by hand: that format has no writer library.
  ``reference_dir`` alongside holds the same weights dequantized to fp32 for transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_llama(seed: int = 0):
    """A random-weight transformers Llama: 2 layers, hidden 256, 4 heads of 64 (2 KV heads), vocab 512."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024, initializer_range=0.05,
                         rms_norm_eps=1e-5, eos_token_id=None, bos_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def _input_amax(model, calibration: list[list[int]]) -> dict[str, float]:
    amax: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if name.endswith(LINEAR_NAMES):
            def hook(mod, args, name=name):
                amax[name] = max(amax.get(name, 0.0), args[0].abs().max().item())
            hooks.append(module.register_forward_pre_hook(hook))
    with torch.inference_mode():
        for ids in calibration:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return amax


def _weight_min_max(weight: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.float()
    if args.strategy == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    if args.strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    bn, bk = args.block_structure
    n, k = w.shape
    blocks = w.reshape(n // bn, bn, k // bk, bk)
    return blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))


def compressed_tensors_checkpoint(model, out_dir: Path, preset: str, calibration: list[list[int]]) -> Path:
    """Quantize ``model`` (a transformers Llama, changed in place) with the compressed-tensors ``preset`` (``FP8``,
    ``FP8_DYNAMIC`` or ``FP8_BLOCK``), ``lm_head`` ignored, and save it compressed to ``out_dir``."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme(preset, ["Linear"])
    amax = _input_amax(model, calibration) if scheme.input_activations and not scheme.input_activations.dynamic \
        else {}
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for name, module in model.named_modules():
            qs = getattr(module, "quantization_scheme", None)
            if qs is None:
                continue
            scale, zero = calculate_qparams(*_weight_min_max(module.weight, qs.weights), qs.weights)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
            module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
            if name in amax:
                a = torch.tensor([amax[name]])
                scale, zero = calculate_qparams(-a, a, qs.input_activations)
                module.input_scale.copy_(scale.reshape(module.input_scale.shape))
                module.input_zero_point.copy_(zero.reshape(module.input_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(str(out_dir))
    return out_dir


def llm_compressor_checkpoint(model, out_dir: Path, scheme: str, calibration: list[list[int]]) -> Path:
    """Quantize ``model`` (a transformers model, changed in place) with llm-compressor's ``oneshot`` and a
    ``QuantizationModifier`` of ``scheme`` (``FP8``, ``FP8_DYNAMIC`` or ``FP8_BLOCK``, every ``Linear`` but
    ``lm_head``), calibrating static activation scales on ``calibration`` (token-id lists), and save it compressed
    to ``out_dir``: the recipe docs/quantization.md gives users."""
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    data = Dataset.from_dict({"input_ids": calibration, "attention_mask": [[1] * len(ids) for ids in calibration]})
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"]),
            dataset=data, num_calibration_samples=len(calibration),
            max_seq_length=max(len(ids) for ids in calibration))
    model.save_pretrained(out_dir, save_compressed=True)
    return out_dir


def _quantize(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def fp8_checkpoint(model, out_dir: Path, ref_dir: Path, *, block: tuple[int, int] | None,
                   calibration: list[list[int]] | None = None) -> tuple[Path, Path]:
    """Write ``model`` (a transformers Llama) as a ``quant_method: "fp8"`` checkpoint to ``out_dir`` and the same
    FP8 values dequantized to fp32 as a plain checkpoint to ``ref_dir``.

    ``block`` None: per-tensor ``weight_scale`` (``amax / 448``), plus a static ``input_scale`` per layer from the
    ``calibration`` pass when given (``activation_scheme: "static"``); else (rows, cols) blocks with
    ``weight_scale_inv`` [N / rows, K / cols] (``weight_block_size``, dynamic activations).
    """
    from safetensors.torch import save_file

    amax = _input_amax(model, calibration) if calibration else {}
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    quantized, reference = {}, {}
    for name, w in state.items():
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and module.endswith(LINEAR_NAMES)):
            quantized[name] = reference[name] = w
            continue
        if block is None:
            scale = (w.abs().amax() / FP8_MAX).reshape(())
            q = _quantize(w, scale)
            quantized[module + ".weight_scale"] = scale
            reference[name] = q.float() * scale
            if module in amax:
                quantized[module + ".input_scale"] = torch.tensor(amax[module] / FP8_MAX)
        else:
            bn, bk = block
            n, k = w.shape
            scale = w.reshape(n // bn, bn, k // bk, bk).abs().amax(dim=(1, 3)) / FP8_MAX
            full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)
            q = _quantize(w, full)
            quantized[module + ".weight_scale_inv"] = scale
            reference[name] = q.float() * full
        quantized[name] = q
    config = {**model.config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static" if amax else "dynamic"}
    if block is not None:
        qc["weight_block_size"] = list(block)
    for path, tensors, extra in ((out_dir, quantized, {"quantization_config": qc}), (ref_dir, reference, {})):
        path.mkdir(parents=True)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        (path / "config.json").write_text(json.dumps({**config, **extra}))
    return out_dir, ref_dir
