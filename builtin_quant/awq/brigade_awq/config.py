"""AWQConfig: the ``awq`` quantization method's settings, read from the checkpoint's ``quantization_config``.

Selected by ``--quantization awq`` or, with no flag, by ``quant_method: "awq"`` in config.json (as vLLM does).
The keys are AutoAWQ's (transformers' ``AwqConfig``):

========================== =============================================================================
key                        meaning here
========================== =============================================================================
``bits`` / ``w_bit``       must be 4
``group_size`` / ``q_group_size`` rows per scale/zero group, > 0 (every layer's in_features a multiple of it)
``zero_point``             must be true (AutoAWQ's asymmetric GEMM format; zeros are stored)
``version``                ``"gemm"`` (the default); ``"gemv"``, ``"gemv_fast"``, ``"marlin"``, ``"exllama"``,
                           ``"ipex"`` are other layouts and are refused
``modules_to_not_convert`` projections left unquantized (AutoAWQ's rule: an entry matches every module whose
                           name contains it); an entry that names no linear layer of the model is refused
========================== =============================================================================

Only the decoder's linear layers (qkv, o, gate_up, down) are quantized; embeddings and the LM head stay in the
model dtype. No tensor parallelism (``-tp 1``).
"""

from __future__ import annotations

from typing import Any

from brigade.model_executor.layers.linear_method import LinearMethod, QuantizationConfig

SUPPORTED = ("brigade-awq runs AutoAWQ GEMM checkpoints: bits 4, zero_point true, version 'gemm', "
             "group_size > 0")
OTHER_VERSIONS = ("gemv", "gemv_fast", "marlin", "exllama", "ipex")

# Merged layer -> the HF projections it holds, as the Llama family's ``packed_modules_mapping``.
PACKED_MODULES: dict[str, list[str]] = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                        "gate_up_proj": ["gate_proj", "up_proj"]}
HF_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _model_module_names(hf_config: Any) -> list[str] | None:
    """The HF names of the model's modules that an entry of ``modules_to_not_convert`` may name (the decoder's
    projections, the embeddings and the LM head), or None when the layer count is unknown."""
    layers = getattr(hf_config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        return None
    names = ["model.embed_tokens", "lm_head", "model.norm"]
    for i in range(layers):
        names += [f"model.layers.{i}.{p}" for p in HF_LINEARS]
    return names


class AWQConfig(QuantizationConfig):
    """An AWQ GEMM checkpoint's format.

    Attributes:
        bits: 4. pack_factor: 8 codes per int32 word. group_size: rows per group (> 0).
        modules_to_not_convert: name fragments of unquantized modules (AutoAWQ's substring rule), or [].
    """

    name = "awq"

    def __init__(self, bits: int, group_size: int, *, zero_point: bool = True, version: str = "gemm",
                 modules_to_not_convert: list[str] | None = None):
        if isinstance(bits, bool) or bits != 4:
            raise ValueError(f"AWQ bits={bits!r} is not supported; {SUPPORTED}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"AWQ group_size={group_size!r} is not supported; {SUPPORTED}")
        if not zero_point:
            raise ValueError(f"AWQ zero_point=false (symmetric, no qzeros) is not supported; {SUPPORTED}")
        version = str(version).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version {version!r} is not supported; {SUPPORTED} (re-save the checkpoint in "
                             "AutoAWQ's GEMM layout)")
        self.bits = 4
        self.pack_factor = 8
        self.group_size = group_size
        self.zero_point = True
        self.version = version
        self.modules_to_not_convert = list(modules_to_not_convert or [])

    def __repr__(self) -> str:
        return (f"AWQConfig(bits={self.bits}, group_size={self.group_size}, version={self.version!r}, "
                f"modules_to_not_convert={self.modules_to_not_convert})")

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> AWQConfig:
        """Build from config.json's ``quantization_config``.

        Raises:
            ValueError (one line): no AWQ ``quantization_config`` (``--quantization awq`` on an unquantized or
                otherwise quantized checkpoint), or something unsupported (bits other than 4, zero_point false,
                a version other than gemm, a bad group_size, ``modules_to_not_convert`` naming no module).
        """
        qc = cls.checkpoint_quantization_config(hf_config, made_by="AutoAWQ, llm-compressor")
        bits = qc.get("bits", qc.get("w_bit"))
        group_size = qc.get("group_size", qc.get("q_group_size"))
        if bits is None or group_size is None:
            raise ValueError("the checkpoint's AWQ quantization_config lacks 'bits' or 'group_size'; "
                             "both are required")
        skip = qc.get("modules_to_not_convert") or []
        if isinstance(skip, str) or not all(isinstance(m, str) for m in skip):
            raise ValueError(f"AWQ modules_to_not_convert {skip!r} is not a list of module names")
        config = cls(bits, group_size, zero_point=qc.get("zero_point", True), version=qc.get("version", "gemm"),
                     modules_to_not_convert=skip)
        names = _model_module_names(hf_config)
        if names is not None:
            missing = [m for m in skip if not any(m in n for n in names)]
            if missing:
                raise ValueError(f"AWQ modules_to_not_convert names {missing[0]!r}, which is no module of this "
                                 f"{getattr(hf_config, 'model_type', '')} model (entries match HF names such as "
                                 "'model.layers.0.mlp.down_proj'); brigade-awq serves decoder-only checkpoints "
                                 "whose skipped modules exist")
        return config

    def is_quantized(self, prefix: str) -> bool:
        """Whether the linear layer ``prefix`` (a merged name such as ``model.layers.0.self_attn.qkv_proj``) is
        quantized. Raises ValueError when only some of a merged layer's projections are."""
        if not self.modules_to_not_convert:
            return True
        parent, _, leaf = prefix.rpartition(".")
        names = [f"{parent}.{p}" for p in PACKED_MODULES.get(leaf, [leaf])]
        flags = [not any(m in n for m in self.modules_to_not_convert) for n in names]
        if any(flags) != all(flags):
            raise ValueError(f"AWQ quantizes only some of the projections merged into {prefix} "
                             f"({', '.join(n.rpartition('.')[2] for n, f in zip(names, flags) if f)}); "
                             "brigade-awq needs all or none of them quantized")
        return all(flags)

    def get_linear_method(self, prefix: str) -> LinearMethod | None:
        """An ``AWQLinearMethod`` for every quantized linear layer, None for the others."""
        if not self.is_quantized(prefix):
            return None
        from brigade_awq.method import AWQLinearMethod

        return AWQLinearMethod(self, prefix)
