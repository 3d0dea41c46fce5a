"""KV cache specs: what one attention layer stores per block, and the groups of layers that share a block table.

Each attention layer reports a ``KVCacheSpec`` (the model interface's ``kv_cache_specs``). Layers with equal
specs form a ``KVCacheGroup``; one block pool serves every group, and each group has its own block table per
request (vLLM v1's hybrid KV cache manager). A group's manager decides which blocks a request still
needs: all of them for full attention, only those inside the window for a sliding-window layer.

The types here are plain data (no tensors): the scheduler reads them to count blocks, the worker to lay out
the KV tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Bytes an element takes, by the storage dtype's name (``str(torch_dtype).removeprefix("torch.")``); the scheduler
# reads specs without importing a tensor library.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1,
               "int8": 1}


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheSpec:
    """The KV storage of one layer: ``block_size`` tokens a block, ``page_size_bytes`` bytes a block."""

    block_size: int  # tokens per block

    @property
    def page_size_bytes(self) -> int:
        """Bytes one block of one layer takes."""
        raise NotImplementedError

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The most blocks one request of ``max_model_len`` tokens holds at once in this layer's group."""
        return cdiv(max_model_len, self.block_size)

    @property
    def kind(self) -> str:
        """A short name for logs and errors ("full", "sliding_window", ...)."""
        raise NotImplementedError


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    """Paged K and V of ``num_kv_heads`` heads of ``head_size`` in ``dtype`` (the cache's storage dtype, by name:
    "bfloat16", "float8_e4m3fn", ...; a key of ``DTYPE_BYTES``)."""

    num_kv_heads: int
    head_size: int
    dtype: str

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * DTYPE_BYTES[self.dtype]

    def tensor_shape(self, attn_backend: Any, num_blocks: int) -> tuple[int, ...]:
        """One layer's KV tensor shape for ``num_blocks`` blocks: the attention backend's paged K/V layout
        (``attn_backend.kv_cache_shape``, an ``AttentionBackend`` class)."""
        return tuple(attn_backend.kv_cache_shape(num_blocks, self.block_size, self.num_kv_heads, self.head_size))


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends over the whole context: every block of a request stays until it finishes."""

    @property
    def kind(self) -> str:
        return "full"


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434): one latent vector of ``head_size`` values per
    token, the compressed KV (``kv_lora_rank``) then the decoupled rotary key (``qk_rope_head_dim``), shared by
    every query head: ``num_kv_heads`` is 1, and nothing is stored twice (no separate K and V: vLLM's
    ``MLAAttentionSpec``). Blocks are kept as for full attention. DeepSeek-V3: 512 + 64 = 576 values a token.
    """

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * DTYPE_BYTES[self.dtype]

    @property
    def kind(self) -> str:
        return "mla"

    def tensor_shape(self, attn_backend: Any, num_blocks: int) -> tuple[int, ...]:
        """``[num_blocks, block_size, head_size]``, whatever the backend: the latent attention
        (``layers/mla_attention.py``) reads and writes this layout itself."""
        return (num_blocks, self.block_size, self.head_size)


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer whose token at position ``p`` attends to positions ``[p - sliding_window + 1, p]`` only.

    Blocks whose tokens all fall before the window of the request's next token are freed while it runs, so the
    group holds at most ``cdiv(sliding_window - 1 + max_num_batched_tokens, block_size) + 1`` blocks a request.
    """

    sliding_window: int  # tokens, the current one included (HF's ``sliding_window``)

    @property
    def kind(self) -> str:
        return "sliding_window"

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        held = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return min(cdiv(held, self.block_size) + 1, cdiv(max_model_len, self.block_size))


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table per request: their specs are equal.

    ``layer_ids`` are the model's layer indices, ascending; the i-th of them stores its KV in the engine's KV
    tensor ``i`` (tensors are shared across groups: a block id belongs to one group at a time).
    """

    spec: KVCacheSpec
    layer_ids: tuple[int, ...]


@dataclass(frozen=True)
class KVCacheConfig:
    """The engine's KV cache: ``num_blocks`` blocks in one pool shared by ``groups``.

    There are ``num_tensors`` KV tensors of ``num_blocks`` blocks each; layer ``groups[g].layer_ids[i]`` uses
    tensor ``i``. So one block id costs ``num_tensors * page_size_bytes`` bytes, whichever group holds it.
    """

    num_blocks: int
    groups: tuple[KVCacheGroup, ...]

    @property
    def num_tensors(self) -> int:
        return max(len(g.layer_ids) for g in self.groups)

    @property
    def block_size(self) -> int:
        return self.groups[0].spec.block_size

    def tensor_index(self) -> dict[int, tuple[int, int]]:
        """Layer index -> (group id, tensor index)."""
        return {layer: (g, i) for g, group in enumerate(self.groups) for i, layer in enumerate(group.layer_ids)}


def group_layers(specs: dict[int, KVCacheSpec]) -> tuple[KVCacheGroup, ...]:
    """Partition layers into KV cache groups (vLLM's rule for a uniform page size).

    Layers are bucketed by equal spec; the group size is the smallest bucket's layer count, and each bucket is
    cut, in layer order, into groups of that size (the last one may be shorter). A model whose layers all share
    one spec gets one group. Full-attention groups come first.

    Args:
        specs: layer index -> that layer's spec (every attention layer of the model, all pipeline stages).

    Raises:
        ValueError: no layer, or layers whose specs differ in block size or page size (not supported yet).
    """
    if not specs:
        raise ValueError("the model has no attention layer with a KV cache")
    buckets: dict[KVCacheSpec, list[int]] = {}
    for layer in sorted(specs):
        buckets.setdefault(specs[layer], []).append(layer)
    pages = {(s.block_size, s.page_size_bytes) for s in buckets}
    if len(pages) > 1:
        shown = ", ".join(f"{s.kind} ({s.page_size_bytes} bytes a block)" for s in buckets)
        raise ValueError(f"layers whose KV blocks differ in size cannot share one block pool yet: {shown}")
    group_size = min(len(layers) for layers in buckets.values())
    ordered = sorted(buckets.items(), key=lambda item: (not isinstance(item[0], FullAttentionSpec), item[1][0]))
    return tuple(KVCacheGroup(spec, tuple(layers[i:i + group_size]))
                 for spec, layers in ordered for i in range(0, len(layers), group_size))
