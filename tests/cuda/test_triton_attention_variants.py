"""GPU checks of the Triton backend's attention variants (sliding window, logit soft cap, sinks) against the
reference backend (fp32 oracle), on every path: split-KV decode, prefill over cached context, the varlen kernel of
mixed-step graphs, and CUDA-graph replays of decode and mixed steps.

Skipped as a whole on machines without CUDA (CI); run on a GPU with ``pytest tests/cuda``. Fresh random inputs
every case; relative error < 1e-2 in bf16, < 1e-3 in fp32, NaN never passes. Under a sliding window the Triton
cache holds NaN before each request's window, so a kernel that reads those keys (rather than skipping them) fails.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.attention.reference import ReferenceAttentionBackend  # noqa: E402
from brigade_cuda.attention import TritonAttentionBackend  # noqa: E402

TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}
H, HKV, D, BS = 32, 8, 128, 16

VARIANTS = {
    "window": {"sliding_window": 1000},
    "window_short": {"sliding_window": 100},
    "softcap": {"logits_soft_cap": 5.0},
    "sinks": {"sinks": True},
    "all": {"sliding_window": 257, "logits_soft_cap": 5.0, "sinks": True},
}

# (query_lens, context_lens), decodes first; contexts several windows long.
MIXES = {
    "decode": ([1] * 8, [0, 15, 16, 99, 255, 1000, 3001, 8200]),
    "mixed": ([1, 1, 1, 50, 257], [16, 999, 4000, 0, 0]),
    "prefix_cached": ([16, 100, 3, 65], [500, 2047, 64, 1]),
    "long": ([1, 1, 1024], [8191, 9000, 7300]),
}


def _variant(name: str, gen: torch.Generator) -> dict:
    kwargs = dict(VARIANTS[name])
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = (torch.randn(H, generator=gen) * 2).cuda()
    return kwargs


def _poison_before_windows(kv_cache, md, context_lens, window):
    """NaN in every cached position before the window of each request's first query token."""
    flat = kv_cache.view(2, -1, HKV, D)
    for r, ctx in enumerate(context_lens):
        pos = torch.arange(max(ctx - window + 1, 0), device="cuda")
        slots = md.block_table[r, pos // BS].long() * BS + pos % BS
        flat[:, slots] = float("nan")


def _reference(batch, kwargs):
    md = batch.metadata
    return ReferenceAttentionBackend(H, D, HKV, D ** -0.5, **kwargs).forward(
        batch.query.float(), batch.key.float(), batch.value.float(), batch.kv_cache.float().clone(), md)


def _run(mix, variant, dtype, paged_batch_factory, *, mixed_graph=False, splits=None):
    q_lens, ctx_lens = MIXES[mix]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{mix}-{variant}-{dtype}-{mixed_graph}".encode()))
    kwargs = _variant(variant, gen)
    batch = paged_batch_factory(q_lens, ctx_lens, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=BS,
                                dtype=dtype, device="cuda", generator=gen)
    ref = _reference(batch, kwargs)
    md = batch.metadata
    if kwargs.get("sliding_window"):
        _poison_before_windows(batch.kv_cache, md, ctx_lens, kwargs["sliding_window"])
    if mixed_graph:
        md = dataclasses.replace(md, mixed_graph=True)
    backend = TritonAttentionBackend(H, D, HKV, D ** -0.5, decode_num_splits=splits, **kwargs)
    out = backend.forward(batch.query, batch.key, batch.value, batch.kv_cache, md)
    torch.cuda.synchronize()
    return out[: md.num_actual_tokens], ref[: md.num_actual_tokens]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_eager_steps(variant, mix, dtype, paged_batch_factory, rel_err):
    """Decode (split count chosen per step) then the prefill kernel."""
    out, ref = _run(mix, variant, dtype, paged_batch_factory)
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("mix", ["mixed", "prefix_cached", "long"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mixed_graph_varlen_path(variant, mix, dtype, paged_batch_factory, rel_err):
    """Every request through the varlen kernel (long decode contexts split inside it)."""
    out, ref = _run(mix, variant, dtype, paged_batch_factory, mixed_graph=True)
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize("variant", ["window_short", "all"])
def test_decode_split_counts(variant, splits, paged_batch_factory, rel_err):
    out, ref = _run("decode", variant, torch.bfloat16, paged_batch_factory, splits=splits)
    err = rel_err(out, ref)
    assert err < 1e-2, f"relative error {err:.2e}"


def _refill(static, new):
    """Copy a new step's device inputs into the captured graph's static buffers."""
    static.kv_cache[:, : new.kv_cache.shape[1]].copy_(new.kv_cache)
    static.metadata.block_table.zero_()
    static.metadata.block_table[:, : new.metadata.block_table.shape[1]] = new.metadata.block_table
    for name in ("seq_lens", "slot_mapping", "query_start_loc"):
        getattr(static.metadata, name).copy_(getattr(new.metadata, name))
    for name in ("query", "key", "value"):
        getattr(static, name).copy_(getattr(new, name))


@pytest.mark.parametrize("mixed", [False, True], ids=["decode_graph", "mixed_graph"])
@pytest.mark.parametrize("variant", ["window_short", "all"])
def test_replays_in_cuda_graph(variant, mixed, paged_batch_factory, rel_err):
    """Captured once, a step with variants stays correct when lengths, tables and inputs change."""
    gen = torch.Generator().manual_seed(7)
    kwargs = _variant(variant, gen)
    q_lens = [1, 1, 1, 1] if not mixed else [1, 1, 20, 7]

    def step(ctx, seed):
        return paged_batch_factory(q_lens, ctx, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=BS,
                                   dtype=torch.bfloat16, device="cuda", generator=torch.Generator().manual_seed(seed))

    first = step([10, 300, 1200, 64], 0)
    static = dataclasses.replace(first, kv_cache=torch.zeros((2, 4 * 200, BS, HKV, D), dtype=torch.bfloat16,
                                                             device="cuda"))
    table = torch.zeros((4, 200), dtype=torch.int32, device="cuda")
    md = dataclasses.replace(first.metadata, block_table=table, max_seq_len=4 * 200 * BS, mixed_graph=mixed)
    static.metadata = md
    _refill(static, first)
    backend = TritonAttentionBackend(H, D, HKV, D ** -0.5, decode_num_splits=None if mixed else 8, **kwargs)
    backend.forward(static.query, static.key, static.value, static.kv_cache, md)  # compile, allocate buffers
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a fresh metadata: the varlen plan is computed inside the graph
        out = backend.forward(static.query, static.key, static.value, static.kv_cache, dataclasses.replace(md))
    for i, ctx in enumerate(([5, 2999, 40, 700], [0, 17, 3100, 1])):
        new = step(ctx, 100 + i)
        ref = _reference(new, kwargs)
        _refill(static, new)
        graph.replay()
        torch.cuda.synchronize()
        n = new.metadata.num_actual_tokens
        err = rel_err(out[:n], ref[:n])
        assert err < 1e-2, f"replay {i}: relative error {err:.2e}"
