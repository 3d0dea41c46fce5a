"""The model interface: what every model class provides to the engine, in-tree or from a plugin package.

A model is an ``nn.Module`` subclass of ``CausalLM`` registered under its HF architecture name (the
``register_models`` hook). The engine builds it as ``cls(hf_config, dtype=..., attn_backend=...,
quant_config=..., expert_parallel=..., max_model_len=...)``, loads it with ``load_weights``, asks each of its
attention layers for a ``KVCacheSpec`` (``kv_cache_specs``) to lay out the KV cache, and per step calls
``forward`` then ``compute_logits``. What a model can do beyond that is declared, not probed: ``capabilities``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.interfaces.kv_cache_spec import KVCacheSpec
from brigade.model_executor.layers.attention import Attention
from brigade.model_executor.models.pipeline import IntermediateTensors


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model class supports beyond a single-device forward pass. The engine refuses, in one line, a flag
    that asks for a capability the class does not declare."""

    tensor_parallel: bool = False  # column/row-parallel layers over the TP group (-tp)
    pipeline_parallel: bool = False  # builds only its stage's layers and passes ``IntermediateTensors`` (-pp)
    expert_parallel: bool = False  # takes ``expert_parallel=True``: whole experts per rank (--enable-expert-parallel)
    lora: bool = False  # its projections take LoRA slots (--enable-lora)
    fold_norms: bool = False  # ``fold_norm_weights`` folds RMSNorm weights into the projections that read them


class CausalLM(nn.Module):
    """Base class of every decoder-only model Brigade serves.

    Subclasses implement ``forward``, ``compute_logits`` and ``load_weights``, set ``capabilities``, and build their
    attention from ``brigade.model_executor.layers.attention.Attention`` so that ``kv_cache_specs`` finds each
    layer's spec. Layer ``i``'s attention reads ``ctx.kv_caches[i]`` and ``ctx.metadata_for(i)``.
    """

    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities()
    # Merged layer -> the HF projections inside it, in shard order (quantization configs match names through it).
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {}
    # Checkpoint quantization formats (config.json ``quantization_config.quant_method``) that ``load_weights`` turns
    # into the model dtype itself: no quantization method is looked up for them (gpt-oss: "mxfp4").
    dequantized_checkpoint_formats: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: Any = None, expert_parallel: bool = False, max_model_len: int | None = None):
        """Args:
            hf_config: the transformers config of the checkpoint.
            dtype: the parameters' and activations' dtype.
            attn_backend: the attention backend class every ``Attention`` layer instantiates.
            quant_config: a ``QuantizationConfig`` (its linear methods own the quantized layers), or None.
            expert_parallel: spread whole experts over the expert-parallel group (MoE models only).
            max_model_len: the longest sequence (prompt and output, tokens) the engine serves; None when unknown
                (a build that only checks shapes). Phi-3's LongRoPE picks its factors from it.
        """
        super().__init__()
        # An MoE model's per-layer routed-token counts (``ExpertLoad``), reported in /metrics; None without experts.
        self.expert_load: nn.Module | None = None

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext,
                intermediate: IntermediateTensors | None = None) -> torch.Tensor | IntermediateTensors:
        """Run the model (this pipeline stage's layers) on one step's tokens.

        Args:
            input_ids: [T] int64, all scheduled tokens, requests back to back.
            positions: [T] int64, each token's position in its request.
            ctx: the step's attention metadata (per KV cache group) and one KV cache per layer.
            intermediate: on a pipeline stage after the first, what the previous stage returned.

        Returns:
            [T, hidden] hidden states before the final norm, or on a stage before the last the
            ``IntermediateTensors`` to send on.
        """

    @abstractmethod
    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[N, hidden] rows of ``forward``'s output -> [N, vocab] logits (final norm and LM head)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named checkpoint tensors; return the names loaded.

        Raises:
            ValueError: a tensor that matches no parameter or does not fit it, or a parameter left unfilled.
        """

    def kv_cache_specs(self, block_size: int, cache_dtype: torch.dtype) -> dict[int, KVCacheSpec]:
        """The KV cache spec of each attention layer this rank holds: layer index -> spec.

        The default asks every ``Attention`` module (``Attention.kv_cache_spec``); a model with another kind of
        cache (latent attention) overrides it.
        """
        return {m.layer_idx: m.kv_cache_spec(block_size, cache_dtype)
                for m in self.modules() if isinstance(m, Attention)}

    def fold_norm_weights(self) -> int:
        """Fold norm weights into the projections that read them (``capabilities.fold_norms``); returns how many.
        Called once after loading when the platform asks for it."""
        return 0

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """Refuse, in one ConfigError line, an HF config (or ``BrigadeConfig``) this class cannot serve as the
        checkpoint means: an unknown rope type, an attention feature it lacks. The default accepts every config."""
