"""GPU checks of the Triton attention backend against the reference backend (fp32 oracle).

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda``.
Every case draws fresh random Q/K/V and a random-filled cache with scattered blocks; the tolerance is
relative error < 1e-2 for half types and < 1e-3 for fp32, and NaN never passes.
"""

from __future__ import annotations

import zlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.attention.reference import ReferenceAttentionBackend  # noqa: E402
from brigade.attention.reference import write_kv_cache as reference_write_kv_cache  # noqa: E402
from brigade_cuda.attention import TritonAttentionBackend, write_kv_cache  # noqa: E402

TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}

# (query_lens, context_lens); decodes (query_len 1) first, as the scheduler orders them.
MIXES = {
    "decode": ([1] * 9, [0, 1, 15, 16, 17, 255, 1000, 3001, 8200]),
    "prefill": ([2, 37, 128, 300], [0, 0, 0, 0]),
    "mixed": ([1, 1, 1, 50, 257], [16, 999, 4000, 0, 0]),
    "prefix_cached": ([16, 100, 3, 65], [500, 2047, 64, 1]),
    "long": ([1, 1, 1024], [8191, 9000, 7300]),
}


def _check(batch, backend, dtype, rel_err):
    md = batch.metadata
    oracle_cache = batch.kv_cache.float().clone()
    ref = ReferenceAttentionBackend(backend.num_heads, backend.head_size, backend.num_kv_heads, backend.scale
                                    ).forward(batch.query.float(), batch.key.float(), batch.value.float(),
                                              oracle_cache, md)
    expected_cache = batch.kv_cache.clone()
    reference_write_kv_cache(batch.key, batch.value, expected_cache, md.slot_mapping)
    out = backend.forward(batch.query, batch.key, batch.value, batch.kv_cache, md)
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == batch.query.shape
    assert torch.equal(batch.kv_cache, expected_cache), "KV write differs from the reference scatter"
    err = rel_err(out[: md.num_actual_tokens], ref[: md.num_actual_tokens])
    assert err < TOL[dtype], f"relative error {err:.2e}"
    return err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mix", list(MIXES))
def test_batch_mixes(mix, dtype, paged_batch_factory, rel_err):
    q_lens, ctx_lens = MIXES[mix]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{mix}-{dtype}".encode()))
    batch = paged_batch_factory(q_lens, ctx_lens, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                                dtype=dtype, device="cuda", generator=gen)
    _check(batch, TritonAttentionBackend(32, 128, 8, 128 ** -0.5), dtype, rel_err)


# (block_size, num_heads, num_kv_heads, head_size): every block size at the Llama-3-8B head shape, then
# GQA ratios 1, 4, 7, 8 and MQA-like 8 at both common head sizes.
SHAPES = [(16, 32, 8, 128), (32, 32, 8, 128), (64, 32, 8, 128), (128, 32, 8, 128), (16, 8, 8, 64),
          (32, 8, 8, 128), (16, 16, 2, 64), (64, 16, 2, 128), (16, 28, 4, 128), (32, 28, 4, 64),
          (16, 64, 8, 64), (64, 64, 8, 128)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "bs{}-{}q{}kv-d{}".format(*s))
def test_shapes(shape, paged_batch_factory, rel_err):
    block_size, num_heads, num_kv_heads, head_size = shape
    gen = torch.Generator().manual_seed(block_size * 1000 + num_heads * 10 + head_size)
    batch = paged_batch_factory([1, 1, 1, 33, 130], [3, 700, 2500, 0, 1100], num_heads=num_heads,
                                num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size,
                                dtype=torch.bfloat16, device="cuda", generator=gen)
    _check(batch, TritonAttentionBackend(num_heads, head_size, num_kv_heads, head_size ** -0.5),
           torch.bfloat16, rel_err)


@pytest.mark.parametrize("head_size", [80, 96, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_odd_head_sizes(head_size, dtype, paged_batch_factory, rel_err):
    gen = torch.Generator().manual_seed(head_size)
    batch = paged_batch_factory([1, 1, 40, 7], [100, 1500, 0, 300], num_heads=16, num_kv_heads=4,
                                head_size=head_size, block_size=16, dtype=dtype, device="cuda", generator=gen)
    _check(batch, TritonAttentionBackend(16, head_size, 4, head_size ** -0.5), dtype, rel_err)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 16, 32])
def test_decode_split_counts(num_splits, paged_batch_factory, rel_err):
    gen = torch.Generator().manual_seed(num_splits)
    batch = paged_batch_factory([1] * 5, [1, 40, 129, 2000, 5000], num_heads=32, num_kv_heads=8, head_size=128,
                                block_size=16, dtype=torch.bfloat16, device="cuda", generator=gen)
    backend = TritonAttentionBackend(32, 128, 8, 128 ** -0.5, decode_num_splits=num_splits)
    _check(batch, backend, torch.bfloat16, rel_err)


def test_split_counts_share_one_compiled_variant(paged_batch_factory, caplog):
    """The split count changes from step to step outside the graphs (eager steps); neither it nor the strides
    of the split buffers that follow it (``stride_mid_h`` is the split count) may make Triton compile a new
    variant once serving: the compile watch stays silent for 2, 3, 16 and 32 splits after a 5-split step."""
    import logging

    from triton import knobs

    from brigade_cuda import compile_watch

    gen = torch.Generator().manual_seed(3)
    batch = paged_batch_factory([1] * 3, [40, 700, 3000], num_heads=32, num_kv_heads=8, head_size=128,
                                block_size=16, dtype=torch.bfloat16, device="cuda", generator=gen)
    args = (batch.query, batch.key, batch.value, batch.kv_cache, batch.metadata)
    before = knobs.runtime.jit_cache_hook
    try:
        compile_watch.watch()
        TritonAttentionBackend(32, 128, 8, 128 ** -0.5, decode_num_splits=5).forward(*args)
        torch.cuda.synchronize()
        compile_watch.mark_serving()
        with caplog.at_level(logging.WARNING, logger="brigade_cuda.compile_watch"):
            for splits in (2, 3, 16, 32):
                backend = TritonAttentionBackend(32, 128, 8, 128 ** -0.5, decode_num_splits=splits)
                backend.forward(*args)
            torch.cuda.synchronize()
        assert [r.getMessage()[:120] for r in caplog.records] == []
    finally:
        knobs.runtime.jit_cache_hook = before
        compile_watch._watch = None


def test_kv_write_skips_padding_slots(paged_batch_factory):
    gen = torch.Generator().manual_seed(7)
    batch = paged_batch_factory([5, 9], [3, 0], num_heads=8, num_kv_heads=2, head_size=128, block_size=16,
                                dtype=torch.bfloat16, device="cuda", generator=gen)
    slots = batch.metadata.slot_mapping.clone()
    slots[::3] = -1
    expected = batch.kv_cache.clone()
    reference_write_kv_cache(batch.key, batch.value, expected, slots)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, slots)
    assert torch.equal(batch.kv_cache, expected)


def test_decode_replays_in_cuda_graph(paged_batch_factory, rel_err):
    """Captured once, the decode step stays correct when context lengths and block tables change."""
    num_heads, num_kv_heads, head_size = 32, 8, 128
    backend = TritonAttentionBackend(num_heads, head_size, num_kv_heads, head_size ** -0.5, decode_num_splits=8)
    gen = torch.Generator().manual_seed(11)
    first = paged_batch_factory([1] * 4, [10, 300, 1200, 64], num_heads=num_heads, num_kv_heads=num_kv_heads,
                                head_size=head_size, block_size=16, dtype=torch.bfloat16, device="cuda",
                                generator=gen)
    md = first.metadata
    # Static buffers, sized generously, that later steps copy into before each replay.
    static = {name: getattr(md, name).clone() for name in ("seq_lens", "slot_mapping")}
    block_table = torch.zeros((4, 200), dtype=torch.int32, device="cuda")
    block_table[:, : md.block_table.shape[1]] = md.block_table
    kv_cache = torch.randn((2, 4 * 200, 16, num_kv_heads, head_size), device="cuda").to(torch.bfloat16)
    query, key, value = first.query.clone(), first.key.clone(), first.value.clone()
    md.seq_lens, md.slot_mapping, md.block_table = static["seq_lens"], static["slot_mapping"], block_table
    md.max_seq_len = 4 * 200 * 16  # the grid must not depend on the step's real maximum
    backend.forward(query, key, value, kv_cache, md)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(query, key, value, kv_cache, md)
    for step, ctx in enumerate(([5, 2999, 40, 700], [0, 17, 3100, 1])):
        new = paged_batch_factory([1] * 4, ctx, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                  head_size=head_size, block_size=16, dtype=torch.bfloat16, device="cuda",
                                  generator=torch.Generator().manual_seed(100 + step))
        nb = new.kv_cache.shape[1]
        kv_cache[:, :nb].copy_(new.kv_cache)
        block_table.zero_()
        block_table[:, : new.metadata.block_table.shape[1]] = new.metadata.block_table
        static["seq_lens"].copy_(new.metadata.seq_lens)
        static["slot_mapping"].copy_(new.metadata.slot_mapping)
        query.copy_(new.query)
        key.copy_(new.key)
        value.copy_(new.value)
        graph.replay()
        torch.cuda.synchronize()
        ref = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, head_size ** -0.5).forward(
            new.query.float(), new.key.float(), new.value.float(), new.kv_cache.float(), new.metadata)
        err = rel_err(out, ref)
        assert err < 1e-2, f"step {step}: relative error {err:.2e}"


def test_zero_length_padding_request_gives_zeros(paged_batch_factory):
    gen = torch.Generator().manual_seed(3)
    batch = paged_batch_factory([1, 1, 1], [100, 20, 5], num_heads=16, num_kv_heads=4, head_size=128,
                                block_size=16, dtype=torch.bfloat16, device="cuda", generator=gen)
    batch.metadata.seq_lens[2] = 0  # a CUDA-graph padding row
    batch.metadata.slot_mapping[2] = -1
    for splits in (1, 4):
        out = TritonAttentionBackend(16, 128, 4, 128 ** -0.5, decode_num_splits=splits).forward(
            batch.query, batch.key, batch.value, batch.kv_cache, batch.metadata)
        assert torch.isfinite(out[:3]).all()
        assert torch.equal(out[2], torch.zeros_like(out[2]))
