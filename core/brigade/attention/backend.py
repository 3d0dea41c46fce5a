"""The attention-backend interface that every backend (reference, Triton, vendor) implements.

The model runner builds one AttentionMetadata per step. Each attention layer calls its backend's
``forward``, which first writes the step's new K/V into the paged cache through ``slot_mapping`` and
then attends over each request's context through its row of ``block_table``. Models with rotary
embeddings call ``forward_rotary`` instead, which rotates Q/K first; by default that is the rotary op
followed by ``forward``, and a backend may override it to fuse the rotation with its KV write.

Layout of the paged KV cache of one layer: ``[2, num_blocks, block_size, num_kv_heads, head_size]``
(index 0 holds K, 1 holds V). Token ``t`` of request ``r`` lives in block ``block_table[r, t // block_size]``
at offset ``t % block_size``; its flat slot is ``block_id * block_size + offset``. The tensor is in the model
dtype, or in float8 e4m3 with ``--kv-cache-dtype fp8`` (``fp8_kv``: each layer's backend holds its k/v scales).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step inputs shared by all layers. Requests are laid out back to back in the token dimension.

    Invariant: requests are ordered decodes first (query_len == 1), then prefills (query_len > 1);
    ``num_decodes`` counts the former.
    """

    num_reqs: int
    num_actual_tokens: int  # tokens in this step (before any CUDA-graph padding)
    max_query_len: int
    max_seq_len: int
    num_decodes: int  # leading requests with exactly one query token
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, prefix sums of query lengths (device)
    seq_lens: torch.Tensor  # [num_reqs] int32, context + new tokens of each request (device)
    block_table: torch.Tensor  # [num_reqs, max_num_blocks_per_req] int32 (device)
    slot_mapping: torch.Tensor  # [num_tokens] int64, flat KV slot of each new token; -1 = skip (device)
    query_start_loc_cpu: torch.Tensor  # [num_reqs + 1] int32 (host copy)
    seq_lens_cpu: torch.Tensor  # [num_reqs] int32 (host copy)
    # A CUDA graph of a mixed step (``MixedGraphs``): the host integers are the graph's padded sizes (num_reqs
    # requests, some of them padding with query length 0 and seq_len 0; num_actual_tokens token rows, those past
    # query_start_loc[num_reqs] padding with slot -1), num_decodes is 0 whatever the step holds, and every real
    # length must be read from the device tensors. Only backends with supports_mixed_cuda_graphs get it on a GPU.
    mixed_graph: bool = False
    # Per-step state a backend derives from this metadata once (in its first layer) and reuses in every other
    # layer of the step, e.g. a kernel's work plan; keys are the backend's own. Each new metadata, including one
    # made by ``dataclasses.replace``, starts empty, so nothing derived from one step reaches another.
    backend_state: dict[object, object] = field(default_factory=dict, init=False, repr=False, compare=False)


@dataclass(slots=True)
class AttentionContext:
    """What an attention layer needs in one forward pass: the step's metadata and every layer's KV cache.

    Passed explicitly down the model's forward (no module-level globals).
    """

    metadata: AttentionMetadata  # the first KV cache group's (the only one of a model whose layers all match)
    kv_caches: list[torch.Tensor]  # one [2, num_blocks, block_size, num_kv_heads, head_size] per layer
    # One metadata per layer when the model has several KV cache groups: each group has its own block table and
    # slot mapping (``brigade.interfaces.kv_cache_spec``); None: every layer reads ``metadata``.
    layer_metadata: list[AttentionMetadata] | None = None

    def metadata_for(self, layer_idx: int) -> AttentionMetadata:
        """The metadata of layer ``layer_idx``'s KV cache group."""
        return self.metadata if self.layer_metadata is None else self.layer_metadata[layer_idx]


class AttentionBackend(ABC):
    """A paged-attention implementation for one layer shape.

    Subclasses declare what they support through the class attributes; ``validate`` turns a refusal into
    a one-line reason. An empty tuple means "any".
    """

    name: ClassVar[str]
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.float16, torch.bfloat16)
    supported_block_sizes: ClassVar[tuple[int, ...]] = ()
    supported_head_sizes: ClassVar[tuple[int, ...]] = ()
    supported_devices: ClassVar[tuple[str, ...]] = ()
    # True when forward() never syncs with the host and, for a pure-decode batch, its launches depend
    # only on the metadata's host integers, so decode steps can be captured and replayed.
    supports_cuda_graphs: ClassVar[bool] = False
    # True when forward() also handles ``metadata.mixed_graph``: any mix of decodes, prefills and prefill chunks
    # attended with launches that depend only on the padded num_reqs and token count, so a whole mixed step can
    # be captured once per token count and replayed (``MixedGraphs``; vLLM's FULL CUDA-graph mode).
    supports_mixed_cuda_graphs: ClassVar[bool] = False
    # The longest context (tokens, context plus the step's own) a mixed-step graph of this backend should take;
    # steps with a longer one run eagerly. None: any (a backend whose mixed-graph attention splits long contexts).
    mixed_graph_max_context: ClassVar[int | None] = None
    # True when forward() reads and writes a float8 e4m3 KV cache (``--kv-cache-dtype fp8``) with this layer's
    # ``k_scale``/``v_scale`` (``brigade.attention.fp8_kv``); the worker refuses fp8 for a backend without it.
    supports_fp8_kv_cache: ClassVar[bool] = False

    # The attention variants forward() implements (``Attention``'s arguments); a layer asking for one the backend
    # lacks is refused when the model is built, naming both.
    supports_sliding_window: ClassVar[bool] = False
    supports_logits_soft_cap: ClassVar[bool] = False
    supports_sinks: ClassVar[bool] = False

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, scale: float, *,
                 sliding_window: int | None = None, logits_soft_cap: float | None = None,
                 sinks: torch.Tensor | None = None):
        """Args: as ``brigade.model_executor.layers.attention.Attention``; ``sinks`` is that layer's parameter
        ([num_heads] float32, filled when the weights load, so read it at forward time).

        Raises:
            ValueError: a variant this backend does not implement, naming it.
        """
        wanted = {"sliding-window attention": (sliding_window is not None, self.supports_sliding_window),
                  "logit soft-capping": (logits_soft_cap is not None, self.supports_logits_soft_cap),
                  "attention sinks": (sinks is not None, self.supports_sinks)}
        lacking = [name for name, (asked, has) in wanted.items() if asked and not has]
        if lacking:
            raise ValueError(f"attention backend {self.name!r} does not implement {' or '.join(lacking)}, which "
                             "this model needs; choose another with --attention-backend")
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.sinks = sinks
        # The fp8 KV cache's per-layer scales (stored = x / scale, read = stored * scale), Python floats fixed
        # at load (so CUDA graphs capture them as constants); unused by a cache in the model dtype.
        self.k_scale = 1.0
        self.v_scale = 1.0

    @classmethod
    def kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_size: int) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def decode_graph_seq_lens(cls, num_decodes: int, max_model_len: int) -> tuple[int, ...]:
        """Context-length buckets to capture decode CUDA graphs of ``num_decodes`` requests for.

        Ascending, the last one ``max_model_len``. A pure-decode step replays the graph of the smallest
        bucket at least its ``max_seq_len``; while capturing, the metadata's ``max_seq_len`` is the bucket.
        A backend whose launches depend on ``max_seq_len`` (a split-KV decode picking its split count) lists
        more than one bucket to get short-context graphs; the default is one graph per batch size.
        """
        return (max_model_len,)

    @classmethod
    def validate(cls, *, head_size: int, dtype: torch.dtype, block_size: int, device_type: str) -> str | None:
        """Return None when this backend can run the combination, else a one-line reason why not."""
        if cls.supported_devices and device_type not in cls.supported_devices:
            return f"{cls.name} runs on {', '.join(cls.supported_devices)}, not {device_type}"
        if cls.supported_dtypes and dtype not in cls.supported_dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in cls.supported_dtypes)
            return f"{cls.name} supports dtypes {names}, not {str(dtype).removeprefix('torch.')}"
        if cls.supported_block_sizes and block_size not in cls.supported_block_sizes:
            return f"{cls.name} supports block sizes {list(cls.supported_block_sizes)}, not {block_size}"
        if cls.supported_head_sizes and head_size not in cls.supported_head_sizes:
            return f"{cls.name} supports head sizes {list(cls.supported_head_sizes)}, not {head_size}"
        return None

    @abstractmethod
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """Write this step's K/V into ``kv_cache`` at ``slot_mapping``, then attend causally.

        Args:
            query: [num_tokens, num_heads, head_size]
            key, value: [num_tokens, num_kv_heads, head_size]
            kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], updated in place.
            metadata: the step's AttentionMetadata; only the first ``num_actual_tokens`` rows are real.

        Returns:
            [num_tokens, num_heads, head_size], same dtype as query. Rows past num_actual_tokens are
            unspecified.
        """

    def forward_rotary(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                       rotary_emb: Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                                            tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Rotate query and key at each token's position, then do what ``forward`` does.

        The default calls ``rotary_emb(positions, query_flat, key_flat)`` on ``[num_tokens, heads *
        head_size]`` views (the contract of ``RotaryEmbedding``, which may rotate in place or return new
        tensors) and then ``self.forward`` on the rotated Q/K. A backend may override it to fuse the
        rotation with its KV-cache write; the output and the cache must stay the same (up to the rounding
        differences between rotary kernels).

        Args:
            positions: [num_tokens] int64 absolute position of each token (int32 also accepted by the
                built-in rotary ops).
            query: [num_tokens, num_heads, head_size], model dtype.
            key, value: [num_tokens, num_kv_heads, head_size], model dtype.
            kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], updated in place.
            metadata: the step's AttentionMetadata; only the first ``num_actual_tokens`` rows are real.
            rotary_emb: the model's rotary embedding (a
                ``brigade.model_executor.layers.rotary_embedding.RotaryEmbedding``).

        Returns:
            As ``forward``: [num_tokens, num_heads, head_size] in query's dtype.
        """
        num_tokens = query.shape[0]
        q, k = rotary_emb(positions, query.reshape(num_tokens, -1), key.reshape(num_tokens, -1))
        return self.forward(q.view(query.shape), k.view(key.shape), value, kv_cache, metadata)
