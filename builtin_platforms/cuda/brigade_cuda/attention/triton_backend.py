"""The Triton paged-attention backend for CUDA GPUs: KV write, split-KV decode and varlen prefill,
behind the core's attention-backend contract and fit for CUDA graphs (every launch's grid depends only on padded
sizes).

A step's requests arrive decodes first (``metadata.num_decodes`` requests of one query token each),
then prefills. ``forward`` launches at most four kernels: the KV-cache write, the decode split kernel
and its merge, and the prefill kernel. ``forward_rotary`` replaces the model's rotary kernel and the KV
write with one fused kernel (``rotary_kv_write.py``), and in a pure-decode step with nothing at all: the decode
kernel rotates and writes the new K/V itself (``BRIGADE_CUDA_DECODE_ROPE=0`` turns that off);
``BRIGADE_CUDA_FUSED_ROPE_KV=0`` keeps rotary and the KV write as two kernels.
Neither reads device memory on the host (no ``.item()``, no ``.tolist()``); only the host integers of the
metadata size the grids. A float8 e4m3 cache (``--kv-cache-dtype fp8``) takes every kernel's ``KV_FP8`` variant
with the layer's ``k_scale``/``v_scale`` as fp32 arguments, fixed at load, so graphs capture them (``fp8_kv.py``).

Attention variants (sliding window, logit soft cap, sinks; ``variants.py``): every kernel takes them behind
constexpr switches, read from this layer's backend (``self.sliding_window`` etc.), so a layer without them runs
the plain kernels; the window, cap and sinks address are fixed per layer, so graphs capture them too.

CUDA-graph capture of mixed steps (``metadata.mixed_graph``): the KV write (slot -1 for padding rows), then
``varlen_attention`` over every request, its grid set by the padded token and request counts only. Long contexts
split inside that launch (``varlen.py``), so a mixed graph takes any context (``mixed_graph_max_context`` None);
the step's work plan is computed by the first layer and reused by the others.

CUDA-graph capture of decode steps: capture with a fixed number of decode requests and set
``decode_num_splits`` to a fixed value (otherwise it is chosen per step from ``max_seq_len``, which
changes the grid); pad ``slot_mapping`` with -1 and ``seq_lens`` with 0 for padding requests, whose
output rows are then zeros.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from brigade.attention.backend import AttentionBackend, AttentionMetadata
from brigade.model_executor.layers.rotary_embedding import RotaryEmbedding
from brigade_cuda import envs
from brigade_cuda.attention.decode import DecodeRope, choose_num_splits, decode_attention
from brigade_cuda.attention.kv_write import has_contiguous_blocks, write_kv_cache
from brigade_cuda.attention.prefill import prefill_attention
from brigade_cuda.attention.rotary_kv_write import rotary_write_kv_cache
from brigade_cuda.attention.varlen import DEFAULT_SPLIT, varlen_attention, varlen_plan, varlen_tile


@functools.cache
def fused_rope_kv_enabled() -> bool:
    """False when ``BRIGADE_CUDA_FUSED_ROPE_KV=0`` (A/B timing: rotary op and KV write as two kernels).

    Read once per process; tests call ``fused_rope_kv_enabled.cache_clear()`` after changing the env.
    """
    return envs.BRIGADE_CUDA_FUSED_ROPE_KV


@functools.cache
def decode_rope_enabled() -> bool:
    """True unless ``BRIGADE_CUDA_DECODE_ROPE=0``: pure-decode steps rotate and write the new K/V inside the
    decode attention kernel (``decode_attention(rope=...)``), with no rotary/KV-write kernel at all, one launch
    fewer per layer (``docs/performance-notes.md``); "0" keeps the fused rotary + KV-write kernel for A/B
    timing."""
    return envs.BRIGADE_CUDA_DECODE_ROPE


@functools.cache
def single_split_len() -> int:
    """Contexts up to this many tokens are decoded in one split, with no merge kernel
    (``BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN``; 0 turns it off). Decode graphs of up to
    ``SHORT_GRAPH_MAX_BATCH`` requests are also captured for this context bucket."""
    return envs.BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN


@functools.cache
def short_graph_lens() -> tuple[int, ...]:
    """Decode graphs of up to ``SHORT_GRAPH_MAX_BATCH`` requests are also captured for contexts up to each of
    these many tokens, with the split count chosen for that length (``BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN``,
    token counts separated by commas, default "512"; "0" turns it off). At batch 1 the full-length graph
    splits every context 32 ways, most splits empty for a short one; the 512-token bucket launches 8
    (timings in ``docs/performance-notes.md``).

    Raises:
        ValueError: the variable is not a comma-separated list of non-negative integers.
    """
    raw = envs.BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise ValueError(f"BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN must be token counts separated by commas "
                         f"(e.g. 256,512; 0 for none), got {raw!r}")
    return tuple(sorted({int(part) for part in parts} - {0}))


SHORT_GRAPH_MAX_BATCH = 32  # beyond this, a Llama-shaped batch fills the GPU with one split per request


class TritonAttentionBackend(AttentionBackend):
    """Paged attention through Triton kernels on CUDA devices.

    Invariant: reads and writes the same KV layout as the reference backend,
    ``[2, num_blocks, block_size, num_kv_heads, head_size]``, so the two are interchangeable per layer.
    """

    name = "triton"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    supported_block_sizes = (16, 32, 64, 128)
    supported_head_sizes = (64, 80, 96, 128, 256)
    supported_devices = ("cuda",)
    supports_cuda_graphs = True
    supports_mixed_cuda_graphs = True  # metadata.mixed_graph: one varlen kernel whose grid is the padded sizes
    mixed_graph_max_context = None  # the varlen kernel splits long contexts
    supports_fp8_kv_cache = True  # every kernel's KV_FP8 variant, with this layer's k_scale/v_scale (fp8_kv.py)
    supports_sliding_window = True  # constexpr-guarded in every kernel (variants.py)
    supports_logits_soft_cap = True
    supports_sinks = True

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, scale: float,
                 decode_num_splits: int | None = None, **variants):
        """Args as the base class (``variants``: its keyword-only attention variants); ``decode_num_splits`` pins
        the decode split count (for CUDA graphs).

        Raises:
            ValueError: when num_heads is not a multiple of num_kv_heads, or a variant the kernels lack.
        """
        super().__init__(num_heads, head_size, num_kv_heads, scale, **variants)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.decode_num_splits = decode_num_splits
        self._num_sms: dict[int, int] = {}  # device index -> multiprocessor count, read once per device

    @classmethod
    def decode_graph_seq_lens(cls, num_decodes: int, max_model_len: int) -> tuple[int, ...]:
        """Short-context buckets (``single_split_len``, ``short_graph_lens``) for small batches, then
        ``max_model_len``."""
        if num_decodes > SHORT_GRAPH_MAX_BATCH:
            return (max_model_len,)
        short = {n for n in (single_split_len(), *short_graph_lens()) if 0 < n < max_model_len}
        return (*sorted(short), max_model_len)

    def _step_plan(self, query: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """The varlen work plan of this step: computed by the first layer that asks, reused by the others (every
        layer of a model shares the tile; the plan depends only on the step's lengths)."""
        block_q, _, block_n, _, _ = varlen_tile(query.dtype, self.head_size, self.num_heads // self.num_kv_heads)
        key = ("varlen_plan", block_q, block_n)
        plan = metadata.backend_state.get(key)
        if plan is None:
            plan = metadata.backend_state[key] = varlen_plan(
                metadata.query_start_loc, metadata.seq_lens, num_reqs=metadata.num_reqs, block_q=block_q,
                block_n=block_n, split=DEFAULT_SPLIT)
        return plan

    def _multiprocessors(self, device: torch.device) -> int:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._num_sms:
            self._num_sms[index] = torch.cuda.get_device_properties(index).multi_processor_count
        return self._num_sms[index]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """See ``AttentionBackend.forward``; query/key/value must have a contiguous last dimension."""
        num_tokens = metadata.num_actual_tokens
        write_kv_cache(key[:num_tokens], value[:num_tokens], kv_cache, metadata.slot_mapping[:num_tokens],
                       self.k_scale, self.v_scale)
        return self._attend(query, kv_cache, metadata)

    def forward_rotary(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                       rotary_emb: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """See ``AttentionBackend.forward_rotary``: one fused rotary + KV-write kernel, then attention.

        Fused when ``BRIGADE_CUDA_FUSED_ROPE_KV`` is not "0" and ``rotary_emb`` is a plain
        ``RotaryEmbedding`` whose table the kernel reads (fp32 ``cos_sin_cache`` [max_position, rotary_dim]
        on query's device, row-major), query/key/value have a contiguous last dimension and the cache
        contiguous blocks; otherwise the base class's rotary op then ``forward``. Only the first
        ``metadata.num_actual_tokens`` rows are rotated on the fused path (later rows' outputs are
        unspecified either way), with the Triton rotation even when the layer is bound to its native op.
        """
        if not (fused_rope_kv_enabled() and self._can_fuse(rotary_emb, query, key, value, kv_cache)):
            return super().forward_rotary(positions, query, key, value, kv_cache, metadata, rotary_emb)
        if decode_rope_enabled() and metadata.num_decodes == metadata.num_reqs:
            return self._decode_with_rope(positions, query, key, value, kv_cache, metadata, rotary_emb)
        num_tokens = metadata.num_actual_tokens
        rotary_write_kv_cache(positions[:num_tokens], query[:num_tokens], key[:num_tokens], value[:num_tokens],
                              kv_cache, metadata.slot_mapping[:num_tokens], rotary_emb.cos_sin_cache,
                              is_neox_style=rotary_emb.is_neox_style, k_scale=self.k_scale, v_scale=self.v_scale)
        return self._attend(query, kv_cache, metadata)

    def _can_fuse(self, rotary_emb: object, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  kv_cache: torch.Tensor) -> bool:
        # Exact type: a subclass may rotate differently from what its table says.
        if type(rotary_emb) is not RotaryEmbedding or rotary_emb.head_size != self.head_size:
            return False
        table = rotary_emb.cos_sin_cache
        return (table.dtype == torch.float32 and table.dim() == 2 and table.stride(1) == 1
                and table.shape[1] == rotary_emb.rotary_dim and table.device == query.device
                and query.stride(-1) == 1 and key.stride(-1) == 1 and value.stride(-1) == 1
                and has_contiguous_blocks(kv_cache))

    def _decode_with_rope(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                          rotary_emb: RotaryEmbedding) -> torch.Tensor:
        """A pure-decode step in one kernel (two with a split merge): rotary, KV write and attention."""
        rope = DecodeRope(key=key, value=value, positions=positions, slot_mapping=metadata.slot_mapping,
                          cos_sin_cache=rotary_emb.cos_sin_cache, is_neox_style=rotary_emb.is_neox_style)
        return self._attend(query, kv_cache, metadata, rope=rope)

    def _attend(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, *,
                rope: DecodeRope | None = None) -> torch.Tensor:
        """Decode and prefill attention over the cache, which already holds this step's K/V (with ``rope``,
        a pure-decode step whose K/V the decode kernel rotates and writes itself; see ``decode_attention``)."""
        if query.stride(-1) != 1:
            query = query.contiguous()
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        variants = {"sliding_window": self.sliding_window, "logits_soft_cap": self.logits_soft_cap,
                    "sinks": self.sinks}
        if metadata.mixed_graph:  # a mixed-step graph: every request through the varlen kernel
            varlen_attention(query, kv_cache, metadata.block_table, metadata.seq_lens, metadata.query_start_loc,
                             out, num_reqs=metadata.num_reqs, scale=self.scale,
                             plan=self._step_plan(query, metadata), k_scale=self.k_scale, v_scale=self.v_scale,
                             **variants)
            return out
        num_decodes = metadata.num_decodes
        if num_decodes:
            # A windowed layer reads at most its window: split for that length (host integers only).
            keys_read = min(metadata.max_seq_len, self.sliding_window or metadata.max_seq_len)
            num_splits = self.decode_num_splits or choose_num_splits(
                num_decodes, self.num_kv_heads, keys_read, self._multiprocessors(query.device),
                single_split_len=single_split_len())
            decode_attention(query, kv_cache, metadata.block_table, metadata.seq_lens, out,
                             num_decodes=num_decodes, num_splits=num_splits, scale=self.scale, rope=rope,
                             k_scale=self.k_scale, v_scale=self.v_scale, **variants)
        num_prefills = metadata.num_reqs - num_decodes
        if num_prefills:
            prefill_attention(query, kv_cache, metadata.block_table, metadata.seq_lens,
                              metadata.query_start_loc, out, first_req=num_decodes,
                              num_prefills=num_prefills, max_query_len=metadata.max_query_len,
                              scale=self.scale, k_scale=self.k_scale, v_scale=self.v_scale, **variants)
        return out
