"""Phi-3 (``Phi3ForCausalLM``: Phi-3, Phi-3.5 and Phi-4-mini text models): the Llama block, loaded from a
checkpoint that already fuses the projections (Abdin et al. 2024, "Phi-3 Technical Report", arXiv:2404.14219;
transformers' ``modeling_phi3``).

* ``qkv_proj`` holds ``[q | k | v]`` rows and ``gate_up_proj`` ``[gate | up]``, the layout of Brigade's
  ``QKVLinear`` and ``MergedColumnLinear``; each whole tensor loads with shard id None, and under ``-tp`` the layer's
  loader cuts it into its projections and keeps this rank's slice of each (``MergedColumnLinear.weight_loader``).
  Online ``--quantization fp8`` quantizes the merged layers after loading, as for Llama.
* LongRoPE (``rope_scaling`` type ``"longrope"``, formerly ``"su"``): ``rotary_embedding`` picks the short or long
  factors from ``max_model_len`` against ``original_max_position_embeddings``, and scales cos/sin by the attention
  factor. A ``partial_rotary_factor`` below one rotates the first channels of each head only (Phi-4-mini).
* ``sliding_window`` set (Phi-3-mini-4k): every layer attends to that many tokens (``llama.layer_sliding_window``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from brigade.config.errors import ConfigError
from brigade.model_executor.models.interface import ModelCapabilities
from brigade.model_executor.models.llama import LlamaForCausalLM

# The checkpoint's fused projections: loaded whole into the merged layers of the same name.
_FUSED = (".qkv_proj.", ".gate_up_proj.")


class Phi3ForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` whose checkpoint names are already Brigade's merged ones; tensor and pipeline parallel."""

    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities(tensor_parallel=True, pipeline_parallel=True,
                                                                  fold_norms=True)
    # Nothing is packed beyond what the checkpoint packs: its names are the merged layers'.
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {}

    def checkpoint_name(self, hf_name: str) -> tuple[str, Any]:
        """A fused tensor loads whole (shard None: the merged loader splits it per projection); others as Llama."""
        if any(part in hf_name for part in _FUSED):
            return hf_name, None
        return super().checkpoint_name(hf_name)

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """Refuse a rope type Brigade lacks (``LlamaForCausalLM.check_config``) and an MLP activation other than SiLU.

        Raises:
            ConfigError: one line naming the setting.
        """
        super().check_config(hf_config, config)
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{cls.__name__}: activation {act!r} is not supported; Phi-3's MLP runs silu")
