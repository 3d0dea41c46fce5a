"""GPTQConfig: the ``gptq`` quantization method's settings, read from the checkpoint's ``quantization_config``.

Selected by ``--quantization gptq`` or, with no flag, by ``quant_method: "gptq"`` in config.json (as vLLM
does). The keys are AutoGPTQ's ``quantize_config.json`` / GPTQModel's, which transformers copies into
config.json:

==================== ===================================================================================
key                  meaning here
==================== ===================================================================================
``bits``             4 or 8 (2- and 3-bit are refused: 3-bit codes straddle int32 words)
``group_size``       rows per scale/zero group, or -1 for one group (per output channel)
``desc_act``         act-order: the checkpoint's ``g_idx`` is a permuted row-to-group map (it is read
                     either way; ``desc_act: false`` checkpoints may omit it)
``sym``              symmetric quantization; informational: the zeros are stored either way
``checkpoint_format`` ``"gptq"`` (default, AutoGPTQ's v1 zeros, stored minus one) or ``"gptq_v2"``
                     (GPTQModel's, stored as is); ``"marlin"`` and others are refused
``lm_head``          must be false: the LM head is not a linear layer of the ``LinearMethod`` seam
``dynamic``          GPTQModel's per-module overrides: refused when non-empty
``modules_in_block_to_quantize`` when present, projections not listed stay unquantized (vLLM's reading)
==================== ===================================================================================

Only the decoder's linear layers (qkv, o, gate_up, down) are quantized; embeddings and the LM head stay in the
model dtype, as in GPTQ checkpoints. There is no tensor parallelism in Brigade yet (``-tp 1``), so every
layer holds its whole packed matrix.
"""

from __future__ import annotations

from typing import Any

from brigade.model_executor.layers.linear_method import LinearMethod, QuantizationConfig

SUPPORTED = "brigade-gptq runs GPTQ checkpoints of 4 or 8 bits, group_size -1 or > 0, desc_act true or false"
CHECKPOINT_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> zero_offset (see packing)

# Merged layer -> the HF projections it holds, as the Llama family's ``packed_modules_mapping``.
PACKED_MODULES: dict[str, list[str]] = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                        "gate_up_proj": ["gate_proj", "up_proj"]}


class GPTQConfig(QuantizationConfig):
    """A GPTQ checkpoint's format: ``bits``, ``group_size``, ``desc_act``, ``sym`` and the zero convention.

    Attributes:
        bits: 4 or 8. pack_factor: codes per int32 word (``32 // bits``).
        group_size: rows per group, -1 for a single group. desc_act, sym: as in the checkpoint.
        checkpoint_format: "gptq" or "gptq_v2". zero_offset: added to each stored zero (1 for v1, 0 for v2).
        modules_in_block_to_quantize: HF projection names (e.g. ``"self_attn.q_proj"``) that are quantized, or
            None for all.
    """

    name = "gptq"

    def __init__(self, bits: int, group_size: int, *, desc_act: bool = False, sym: bool = True,
                 checkpoint_format: str = "gptq", modules_in_block_to_quantize: list[str] | None = None):
        if isinstance(bits, bool) or not isinstance(bits, int) or bits not in (4, 8):
            raise ValueError(f"GPTQ bits={bits!r} is not supported; {SUPPORTED}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or not (group_size == -1 or group_size > 0):
            raise ValueError(f"GPTQ group_size={group_size!r} is not valid; {SUPPORTED}")
        if checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(f"GPTQ checkpoint_format {checkpoint_format!r} is not supported; brigade-gptq reads "
                             f"{' and '.join(repr(f) for f in CHECKPOINT_FORMATS)} (re-save the checkpoint in the "
                             "'gptq' format, e.g. with GPTQModel)")
        self.bits = bits
        self.pack_factor = 32 // bits
        self.group_size = group_size
        self.desc_act = bool(desc_act)
        self.sym = bool(sym)
        self.checkpoint_format = checkpoint_format
        self.zero_offset = CHECKPOINT_FORMATS[checkpoint_format]
        self.modules_in_block_to_quantize = modules_in_block_to_quantize

    def __repr__(self) -> str:
        return (f"GPTQConfig(bits={self.bits}, group_size={self.group_size}, desc_act={self.desc_act}, "
                f"sym={self.sym}, checkpoint_format={self.checkpoint_format!r})")

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> GPTQConfig:
        """Build from config.json's ``quantization_config``.

        Raises:
            ValueError (one line): the checkpoint has no GPTQ ``quantization_config`` (``--quantization gptq``
                on an unquantized or otherwise quantized checkpoint), or it asks for something unsupported
                (bits other than 4/8, a bad group_size, checkpoint_format "marlin", a quantized lm_head,
                GPTQModel ``dynamic`` overrides, a pack dtype other than int32).
        """
        qc = cls.checkpoint_quantization_config(hf_config, made_by="AutoGPTQ, GPTQModel")
        if qc.get("is_marlin_format"):
            raise ValueError("GPTQ checkpoints in the Marlin layout (is_marlin_format) are not supported; "
                             f"{SUPPORTED}, in AutoGPTQ's packed layout")
        if qc.get("lm_head"):
            raise ValueError("GPTQ with a quantized lm_head (lm_head: true) is not supported; brigade-gptq "
                             "quantizes the decoder's linear layers only")
        if qc.get("dynamic"):
            raise ValueError("GPTQModel's per-module overrides (quantization_config.dynamic) are not supported; "
                             f"{SUPPORTED}, one setting for every layer")
        pack_dtype = qc.get("pack_dtype")
        if pack_dtype not in (None, "int32", "torch.int32"):
            raise ValueError(f"GPTQ pack_dtype {pack_dtype!r} is not supported; brigade-gptq reads int32-packed "
                             "qweight/qzeros (AutoGPTQ's layout)")
        if "bits" not in qc or "group_size" not in qc:
            raise ValueError("the checkpoint's GPTQ quantization_config lacks 'bits' or 'group_size'; "
                             "both are required")
        modules = qc.get("modules_in_block_to_quantize")
        flat = None if not modules else [name for item in modules
                                         for name in (item if isinstance(item, list) else [item])]
        return cls(qc["bits"], qc["group_size"], desc_act=bool(qc.get("desc_act", False)),
                   sym=bool(qc.get("sym", True)), checkpoint_format=qc.get("checkpoint_format") or "gptq",
                   modules_in_block_to_quantize=flat)

    def is_quantized(self, prefix: str) -> bool:
        """Whether the linear layer ``prefix`` (a merged name such as ``model.layers.0.self_attn.qkv_proj``) is
        quantized. Raises ValueError when only some of a merged layer's projections are."""
        if self.modules_in_block_to_quantize is None:
            return True
        parent, _, leaf = prefix.rpartition(".")
        names = [f"{parent}.{p}" for p in PACKED_MODULES.get(leaf, [leaf])]
        flags = [any(n == m or n.endswith("." + m) for m in self.modules_in_block_to_quantize) for n in names]
        if any(flags) != all(flags):
            raise ValueError(f"GPTQ quantizes only some of the projections merged into {prefix} "
                             f"({', '.join(n.rpartition('.')[2] for n, f in zip(names, flags) if f)}); "
                             "brigade-gptq needs all or none of them quantized")
        return all(flags)

    def get_linear_method(self, prefix: str) -> LinearMethod | None:
        """A ``GPTQLinearMethod`` for every quantized linear layer, None for the others."""
        if not self.is_quantized(prefix):
            return None
        from brigade_gptq.method import GPTQLinearMethod

        return GPTQLinearMethod(self, prefix)
