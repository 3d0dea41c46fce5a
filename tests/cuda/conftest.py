"""Builders of random paged-attention batches for the CUDA kernel tests (no CUDA needed to import)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from brigade.attention.backend import AttentionMetadata


@dataclass
class PagedBatch:
    """One step's inputs: metadata, fresh random Q/K/V and a KV cache prefilled with random context."""

    metadata: AttentionMetadata
    query: torch.Tensor  # [num_tokens, num_heads, head_size]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_size]


def make_paged_batch(query_lens: list[int], context_lens: list[int], *, num_heads: int, num_kv_heads: int,
                     head_size: int, block_size: int, dtype: torch.dtype, device: str | torch.device,
                     generator: torch.Generator | None = None) -> PagedBatch:
    """Build a batch; requests must come decodes first (query_len 1), as the scheduler orders them.

    Each request's blocks are scattered over a shuffled pool, unused block-table entries point at random
    blocks, and the cache holds random values everywhere (never zeros), so wrong indexing shows.
    """
    num_decodes = 0
    while num_decodes < len(query_lens) and query_lens[num_decodes] == 1:
        num_decodes += 1
    assert all(q > 1 for q in query_lens[num_decodes:]), "decodes must come first"
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_per_req) + 1
    num_blocks = sum(blocks_per_req) + 7
    perm = torch.randperm(num_blocks, generator=generator)
    block_table = torch.randint(0, num_blocks, (len(seq_lens), max_blocks), generator=generator,
                                dtype=torch.int32)
    slots: list[int] = []
    used = 0
    for r, (n_blocks, ctx, q) in enumerate(zip(blocks_per_req, context_lens, query_lens)):
        block_table[r, :n_blocks] = perm[used:used + n_blocks].to(torch.int32)
        used += n_blocks
        for pos in range(ctx, ctx + q):
            slots.append(int(block_table[r, pos // block_size]) * block_size + pos % block_size)
    num_tokens = sum(query_lens)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype).to(device)

    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    metadata = AttentionMetadata(
        num_reqs=len(query_lens), num_actual_tokens=num_tokens, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), num_decodes=num_decodes, query_start_loc=qsl.to(device),
        seq_lens=seq_lens_t.to(device), block_table=block_table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device), query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens_t)
    return PagedBatch(metadata=metadata, query=rand(num_tokens, num_heads, head_size),
                      key=rand(num_tokens, num_kv_heads, head_size),
                      value=rand(num_tokens, num_kv_heads, head_size),
                      kv_cache=rand(2, num_blocks, block_size, num_kv_heads, head_size))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere in ``out`` gives inf."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out64).all():
        return float("inf")
    return float((out64 - ref64).norm() / ref64.norm())


@pytest.fixture
def paged_batch_factory():
    """The ``make_paged_batch`` builder."""
    return make_paged_batch


@pytest.fixture
def rel_err():
    """The ``relative_error`` metric."""
    return relative_error


@pytest.fixture
def cuda_ops_registered():
    """The CUDA plugin's kernels, as its ``register_kernels`` hook registers them for the active "cuda"
    platform: layers built on a CUDA device inside the test bind them."""
    from brigade.plugins import current_platform, load_plugins, registries

    load_plugins("engine")
    assert current_platform().name == "cuda", current_platform()
    assert "rms_norm@cuda" in registries.kernels, registries.kernels
    yield
