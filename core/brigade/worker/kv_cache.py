"""KVCacheSpec: the shape, size and layout of the runner's paged KV cache.

One tensor per layer, laid out as the attention backend asks (``AttentionBackend.kv_cache_shape``). The
worker sizes the pool from ``bytes_per_block``; KV connectors share blocks only between equal ``layout``s.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from brigade.attention.backend import AttentionBackend
from brigade.distributed.sharding import attention_shard, pp_layer_range
from brigade.kv_transfer import KVCacheLayout


@dataclass(frozen=True)
class KVCacheSpec:
    """What one layer's KV tensor looks like for a model on an attention backend."""

    attn_backend: type[AttentionBackend]
    block_size: int  # tokens per block
    head_size: int
    num_kv_heads: int
    num_layers: int
    dtype: torch.dtype  # the model's
    layers: range | None = None  # the layers whose KV this rank holds (its pipeline stage's); None: all
    cache_dtype: torch.dtype | None = None  # what the cache stores (float8 e4m3 with --kv-cache-dtype fp8); None: dtype

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype of the cache tensors: ``cache_dtype``, else the model's."""
        return self.cache_dtype or self.dtype

    @classmethod
    def for_model(cls, hf_config, attn_backend: type[AttentionBackend], block_size: int,
                  dtype: torch.dtype, *, tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1,
                  cache_dtype: torch.dtype | None = None) -> KVCacheSpec:
        """The spec of an HF config's attention (``head_dim`` or hidden / heads; KV heads default to heads) on one
        rank of ``tp_size``: its KV heads only (one when ``tp_size`` exceeds them: replicated), and with a
        pipeline, the layers of stage ``pp_rank`` of ``pp_size`` only; stored in ``cache_dtype`` (None: the
        model ``dtype``)."""
        head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
        if tp_size > 1:
            num_kv_heads = attention_shard(hf_config.num_attention_heads, num_kv_heads, 0, tp_size).num_kv_heads
        layers = None
        if pp_size > 1:
            layers = range(*pp_layer_range(hf_config.num_hidden_layers, pp_rank, pp_size))
        return cls(attn_backend, block_size, head_size, num_kv_heads, hf_config.num_hidden_layers, dtype, layers,
                   cache_dtype)

    def shape(self, num_blocks: int) -> tuple[int, ...]:
        """One layer's tensor shape for ``num_blocks`` blocks."""
        return tuple(self.attn_backend.kv_cache_shape(num_blocks, self.block_size, self.num_kv_heads,
                                                      self.head_size))

    def bytes_per_block(self, cache_dtype: torch.dtype | None = None) -> int:
        """Bytes one block takes across all layers (K and V), in ``cache_dtype`` (default: the cache's own)."""
        elem = torch.empty((), dtype=cache_dtype or self.storage_dtype).element_size()
        held = self.num_layers if self.layers is None else len(self.layers)
        return math.prod(self.shape(1)) * elem * held

    def allocate(self, num_blocks: int, device: torch.device) -> list[torch.Tensor]:
        """One zeroed tensor per layer of ``num_blocks`` blocks on ``device`` (an empty one for a layer another
        pipeline stage holds, so layer ``i`` still reads entry ``i``)."""
        dtype = self.storage_dtype
        return [torch.zeros(self.shape(num_blocks), dtype=dtype, device=device)
                if self.layers is None or i in self.layers else torch.empty(0, dtype=dtype, device=device)
                for i in range(self.num_layers)]

    def layout(self, model_config) -> KVCacheLayout:
        """The layout of these KV blocks, for KV connectors: blocks are shared only between equal layouts.

        The model is named by its directory's real path (plus the quantization method, and the seed of dummy
        weights), the block dimension found by asking the attention backend for caches of 1 and 2 blocks.
        """
        one, two = self.shape(1), self.shape(2)
        block_dim = next(i for i, (a, b) in enumerate(zip(one, two)) if a != b)
        model = os.path.realpath(model_config.model)
        if model_config.quantization:
            model += f"+{model_config.quantization}"
        if model_config.load_format == "dummy":
            model += f"+dummy(seed={model_config.seed})"
        dtype = str(self.storage_dtype).removeprefix("torch.")
        return KVCacheLayout(model=model, dtype=dtype, block_size=self.block_size,
                             num_layers=self.num_layers, block_shape=one[:block_dim] + one[block_dim + 1:],
                             block_dim=block_dim)
