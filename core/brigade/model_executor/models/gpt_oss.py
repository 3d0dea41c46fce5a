"""gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"): a mixture-of-experts decoder with attention
sinks, alternating sliding-window and full attention, and clamped-SwiGLU experts with biases.

What differs from the Llama-family MoE decoders (``sparse_moe``), following transformers' ``modeling_gpt_oss``:

* Attention: q/k/v/o with biases, GQA, ``head_dim`` 64 with scale ``head_dim ** -0.5``; one learned logit per
  query head (``self_attn.sinks``) joins every softmax's denominator; the layers of ``layer_types``
  ``"sliding_attention"`` attend to the last ``sliding_window`` tokens only, the others to the whole context.
  Rotary embedding with YaRN scaling (``rotary_embedding.yarn_parameters``), neox style.
* MoE (``mlp``): the router (``mlp.router``, a linear layer with a bias) takes the ``top_k`` largest logits and
  a softmax over those; each expert is ``down(act(gate(x)) * ...)`` with biases on all three and the clamped
  SwiGLU of ``moe_activation`` (``swiglu_alpha``, ``swiglu_limit``).
* The checkpoint fuses every layer's experts: ``experts.gate_up_proj`` [E, H, 2I] whose columns interleave gate
  and up (gate in the even ones), ``gate_up_proj_bias`` [E, 2I] likewise, ``down_proj`` [E, I, H],
  ``down_proj_bias`` [E, H]. MXFP4 checkpoints (``quant_method: mxfp4``) store the two matrices as
  ``*_blocks``/``*_scales`` in the [E, out, in] orientation; they are dequantized at load (``mxfp4``).
  ``GptOssForCausalLM.load_weights`` splits all of these into the per-expert projections ``FusedMoE`` loads.
* RMSNorm everywhere, no embedding scale, an untied LM head.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from brigade.config import ConfigError
from brigade.model_executor.layers.rotary_embedding import get_rope_parameters
from brigade.model_executor.models.interface import ModelCapabilities
from brigade.model_executor.models.llama import LlamaAttention
from brigade.model_executor.models.sparse_moe import MoEDecoderLayer, MoEForCausalLM, check_moe_config
from brigade.model_executor.mxfp4 import dequantize_mxfp4
from brigade.model_executor.weight_utils import materialize, narrow_weight, set_weight_attrs

LAYER_TYPES = ("sliding_attention", "full_attention")
# ...mlp.experts.{gate_up_proj|down_proj}[_bias|_blocks|_scales]: a whole layer's experts in one tensor
_FUSED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")


def layer_types(config: Any) -> list[str]:
    """Each layer's attention type: ``config.layer_types``, else transformers' default (sliding on even layers)."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(config.num_hidden_layers)]


class GptOssAttention(LlamaAttention):
    """Llama's attention block with gpt-oss's sinks and per-layer window. ``attn.sinks`` loads from the checkpoint's
    ``self_attn.sinks`` [num_heads], of which a tensor-parallel rank keeps its query heads' entries."""

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(config, **kwargs)
        set_weight_attrs(self.attn.sinks, {"weight_loader": self.load_sinks})

    def attention_options(self, config: Any, layer_idx: int) -> dict[str, Any]:
        """Llama's options with gpt-oss's window on the layers ``layer_types`` marks sliding, and its sinks."""
        sliding = layer_types(config)[layer_idx] == "sliding_attention"
        return {**super().attention_options(config, layer_idx),
                "sliding_window": int(config.sliding_window) if sliding else None, "use_sinks": True}

    def load_sinks(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        """Args: param [local heads] fp32; loaded [num_heads] (any float dtype), query head order.

        Raises:
            ValueError: a tensor of another length than the model's query heads.
        """
        heads = self.qkv_proj.num_heads  # this rank's
        total = heads * self.qkv_proj.tp_size
        if tuple(loaded.shape) != (total,):
            raise ValueError(f"sinks of shape {tuple(loaded.shape)} do not fit the {total} query heads")
        param.data.copy_(materialize(narrow_weight(loaded, 0, self.qkv_proj.tp_rank * heads, heads)))


class GptOssDecoderLayer(MoEDecoderLayer):
    """Every layer sparse; attention with sinks and, on the sliding layers, a window."""

    attention_cls: ClassVar[type[nn.Module]] = GptOssAttention


class GptOssForCausalLM(MoEForCausalLM):
    """gpt-oss on Brigade's MoE decoder: ``mlp.router`` loads into the block's ``gate`` (weight and bias), the
    fused expert tensors into ``FusedMoE`` one expert and projection at a time (dequantized first when MXFP4)."""

    decoder_layer_cls: ClassVar[type[nn.Module]] = GptOssDecoderLayer
    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities(tensor_parallel=True, expert_parallel=True,
                                                                  fold_norms=True)
    dequantized_checkpoint_formats: ClassVar[frozenset[str]] = frozenset({"mxfp4"})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """``MoEForCausalLM.load_weights`` on the checkpoint with its fused expert tensors split per expert
        (``split_experts``). Returns the checkpoint's own names.

        Raises:
            ValueError: as ``LlamaForCausalLM.load_weights``; an MXFP4 ``*_blocks`` tensor without its
                ``*_scales`` (or the reverse), or a fused expert tensor of the wrong shape.
        """
        consumed: set[str] = set()
        loaded = super().load_weights(self.split_experts(weights, consumed))
        return {name for name in loaded if ".experts." not in name} | consumed

    def checkpoint_name(self, hf_name: str) -> tuple[str, Any]:
        hf_name = hf_name.replace(".mlp.router.", ".mlp.gate.")
        if hf_name.endswith(".self_attn.sinks"):
            return hf_name.replace(".self_attn.sinks", ".self_attn.attn.sinks"), None
        return super().checkpoint_name(hf_name)

    def split_experts(self, weights: Iterable[tuple[str, torch.Tensor]], consumed: set[str]
                      ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield the checkpoint's tensors, each fused expert tensor replaced by its local experts' projections
        under Mixtral-style names (``...experts.{e}.gate_proj.weight`` [I, H], ``up_proj``, ``down_proj``
        [H, I], and their ``.bias``), de-interleaving gate and up and dequantizing MXFP4 pairs. Names of the
        fused tensors go into ``consumed``."""
        experts = {name: m for name, m in self.named_modules() if name.endswith(".experts")}
        pending: dict[str, dict[str, Any]] = {}  # MXFP4 tensor waiting for its pair: base name -> parts
        for name, tensor in weights:
            match = _FUSED_EXPERTS.search(name)
            if match is None:
                yield name, tensor
                continue
            consumed.add(name)
            prefix, proj, kind = name[:match.start()] + ".experts", match.group(1), match.group(2) or ""
            layer = experts.get(prefix)
            if kind in ("_blocks", "_scales"):
                parts = pending.setdefault(f"{prefix}.{proj}", {})
                parts[kind] = tensor
                if len(parts) < 2:
                    continue
                del pending[f"{prefix}.{proj}"]
                tensor = parts
            if layer is not None:
                yield from _expert_tensors(layer, prefix, proj, kind, tensor, self.dtype)
        if pending:
            raise ValueError(f"MXFP4 tensors without their pair (*_blocks and *_scales): {', '.join(pending)}")

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """``MoEForCausalLM.check_config`` with MXFP4 checkpoints accepted (dequantized at load), plus: a rope type
        Brigade lacks, a layer type other than sliding or full attention, ``--quantization``.

        Raises:
            ConfigError: one line naming the setting and what Brigade runs.
        """
        try:
            get_rope_parameters(hf_config)
        except ValueError as e:
            raise ConfigError(f"GptOss: {e}") from None
        types = layer_types(hf_config)
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown or len(types) != hf_config.num_hidden_layers:
            raise ConfigError(f"GptOss: layer_types must name each of the {hf_config.num_hidden_layers} layers "
                              f"'sliding_attention' or 'full_attention', got {len(types)} entries"
                              + (f" with {', '.join(map(repr, unknown))}" if unknown else ""))
        if config.model_config.quantization is not None:
            raise ConfigError(f"GptOss: --quantization {config.model_config.quantization} is not supported; serve "
                              "it without: the experts run in the model dtype (MXFP4 checkpoints are dequantized)")
        check_moe_config(hf_config, config, dequantized=cls.dequantized_checkpoint_formats)


def _expert_tensors(layer: Any, prefix: str, proj: str, kind: str, tensor: Any, dtype: torch.dtype
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """The per-expert projections of one fused tensor for the experts ``layer`` (a ``FusedMoE``) holds.

    ``tensor``: gate_up_proj [E, H, 2I] or down_proj [E, I, H] (transposed here to [out, in]); a bias [E, out];
    or an MXFP4 pair ``{"_blocks": [E, out, G, 16], "_scales": [E, out, G]}``, already [out, in]."""
    suffix = "bias" if kind == "_bias" else "weight"
    for expert in range(layer.expert_start, layer.expert_start + layer.num_local_experts):
        if kind == "_blocks" or kind == "_scales":
            blocks, scales = (materialize(narrow_weight(tensor[k], 0, expert, 1))[0] for k in ("_blocks", "_scales"))
            value = dequantize_mxfp4(blocks, scales, dtype)  # [out, in]
        else:
            value = materialize(narrow_weight(tensor, 0, expert, 1))[0]
            if kind == "":
                value = value.t()  # [in, out] -> [out, in]
        name = f"{prefix}.{expert}"
        if proj == "down_proj":
            yield f"{name}.down_proj.{suffix}", value.contiguous()
        else:  # rows (or entries) interleave gate and up, gate first
            yield f"{name}.gate_proj.{suffix}", value[0::2].contiguous()
            yield f"{name}.up_proj.{suffix}", value[1::2].contiguous()
