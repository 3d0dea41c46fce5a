"""GPU checks of the varlen (mixed prefill/decode, CUDA-graph-ready) Triton attention kernel against the reference
backend (fp32 oracle).

Skipped as a whole on machines without CUDA (CI runs the kernel's logic under the interpreter instead:
tests/attention/test_varlen_interpreted.py); run on the H200 with ``pytest tests/cuda``. Each case draws fresh
random Q/K/V and a random-filled cache with scattered blocks (``paged_batch_factory``, decodes first), computes
the reference on that batch, and then lays the requests out for the kernel in any order, followed by padding
requests (``q_len`` 0 with and without a context, ``seq_len`` 0 with query rows) and padded token rows. ``out``
starts filled with a sentinel: real rows must match the reference (relative error < 1e-2 for half types, < 1e-3
for fp32, NaN never passes), every other row must keep the sentinel.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.attention.reference import ReferenceAttentionBackend  # noqa: E402
from brigade.attention.reference import write_kv_cache as reference_write_kv_cache  # noqa: E402
from brigade_cuda.attention import varlen as varlen_module  # noqa: E402
from brigade_cuda.attention.varlen import VarlenSplit, varlen_attention, varlen_plan  # noqa: E402

TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
SENTINEL = -7.25  # exact in every dtype
PADDING = ((0, 0), (0, 40), (2, 0))  # (q_len, seq_len) of the padding requests appended to each step


@dataclass
class Step:
    """One step as the kernel takes it, and what it must produce."""

    query: torch.Tensor  # [T, num_heads, head_size]
    kv_cache: torch.Tensor  # holds this step's K/V
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    num_reqs: int
    num_real: int  # rows 0 .. num_real - 1 belong to real requests, in order
    expected: torch.Tensor  # [num_real, num_heads, head_size] fp32 reference
    scale: float


def _arrange(batch, order: list[int], *, padding=PADDING, num_tokens: int | None = None) -> Step:
    """Write the batch's K/V into its cache, compute the reference, and lay its requests out in ``order`` (indices
    into the batch's decodes-first order), then the ``padding`` requests, then padded rows up to ``num_tokens``
    (default: five past the last row any request owns)."""
    md = batch.metadata
    num_heads, head_size = batch.query.shape[1:]
    num_kv_heads = batch.kv_cache.shape[3]
    scale = head_size ** -0.5
    reference_write_kv_cache(batch.key, batch.value, batch.kv_cache, md.slot_mapping)
    ref = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, scale).forward(
        batch.query.float(), batch.key.float(), batch.value.float(), batch.kv_cache.float(), md)
    qsl = md.query_start_loc_cpu.tolist()
    assert sorted(order) == list(range(md.num_reqs))
    src = torch.tensor([row for r in order for row in range(qsl[r], qsl[r + 1])], device=batch.query.device)
    num_real = src.numel()
    q_lens = [qsl[r + 1] - qsl[r] for r in order] + [q for q, _ in padding]
    seq_lens = [int(md.seq_lens_cpu[r]) for r in order] + [s for _, s in padding]
    owned = sum(q_lens)
    num_tokens = owned + 5 if num_tokens is None else num_tokens
    assert num_tokens >= owned
    device, dtype = batch.query.device, batch.query.dtype
    query = torch.randn(num_tokens, num_heads, head_size, device=device).to(dtype)
    query[:num_real] = batch.query[src]
    num_blocks = batch.kv_cache.shape[1]
    pad_table = torch.randint(0, num_blocks, (len(padding), md.block_table.shape[1]), dtype=torch.int32,
                              device=device)
    block_table = torch.cat([md.block_table[order], pad_table]).contiguous()
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    return Step(query=query, kv_cache=batch.kv_cache, block_table=block_table,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
                query_start_loc=query_start_loc.to(device), num_reqs=len(q_lens), num_real=num_real,
                expected=ref[src], scale=scale)


def _check(step: Step, out: torch.Tensor, rel_err) -> float:
    """Real rows against the reference; every other row still the sentinel."""
    torch.cuda.synchronize()
    err = rel_err(out[: step.num_real], step.expected)
    assert err < TOL[out.dtype], f"relative error {err:.2e}"
    rest = out[step.num_real:]
    assert torch.equal(rest, torch.full_like(rest, SENTINEL)), "rows without a real request were written"
    return err


def _run(step: Step, rel_err, tile=None, split: VarlenSplit | None = None) -> float:
    out = torch.full_like(step.query, SENTINEL)
    varlen_attention(step.query, step.kv_cache, step.block_table, step.seq_lens, step.query_start_loc, out,
                     num_reqs=step.num_reqs, scale=step.scale, tile=tile, **({"split": split} if split else {}))
    return _check(step, out, rel_err)


# name: (query_lens, context_lens) in the factory's decodes-first order, and the order the kernel sees them in.
MIXES = {
    "decodes": ([1] * 9, [0, 1, 15, 16, 17, 255, 1000, 3001, 8200], [4, 8, 0, 2, 7, 1, 6, 3, 5]),
    "prefills": ([2, 37, 128, 300], [0, 0, 0, 0], [2, 0, 3, 1]),
    "mixed_decodes_first": ([1, 1, 1, 50, 257], [16, 999, 4000, 0, 0], [0, 1, 2, 3, 4]),
    "mixed_interleaved": ([1, 1, 1, 50, 257], [16, 999, 4000, 0, 0], [3, 0, 4, 1, 2]),
    "mixed_prefills_first": ([1, 1, 1, 50, 257], [16, 999, 4000, 0, 0], [4, 3, 2, 1, 0]),
    "prefix_cached": ([1, 1, 16, 100, 3, 65], [7, 300, 500, 2047, 64, 1], [2, 0, 3, 4, 1, 5]),
    "long": ([1, 1, 1024], [8191, 9000, 7300], [2, 0, 1]),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mix", list(MIXES))
def test_batch_mixes(mix, dtype, paged_batch_factory, rel_err):
    q_lens, ctx_lens, order = MIXES[mix]
    gen = torch.Generator().manual_seed(zlib.crc32(f"varlen-{mix}-{dtype}".encode()))
    batch = paged_batch_factory(q_lens, ctx_lens, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                                dtype=dtype, device="cuda", generator=gen)
    _run(_arrange(batch, order), rel_err)


# (block_size, num_heads, num_kv_heads, head_size): GQA groups 1, 3 (not a power of two), 4, 5, 8 and 32 (MQA-like),
# head sizes 64 to 256 including 80 and 96, block sizes 16 and 32.
SHAPES = [(16, 32, 8, 128), (32, 32, 8, 128), (16, 8, 8, 64), (32, 16, 16, 128), (32, 16, 4, 64),
          (16, 64, 8, 128), (32, 12, 4, 128), (16, 12, 4, 80), (32, 16, 4, 96), (16, 16, 4, 256),
          (32, 32, 4, 256), (16, 40, 8, 128), (16, 32, 1, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "bs{}-{}q{}kv-d{}".format(*s))
def test_shapes(shape, paged_batch_factory, rel_err):
    block_size, num_heads, num_kv_heads, head_size = shape
    gen = torch.Generator().manual_seed(block_size * 1000 + num_heads * 10 + head_size)
    batch = paged_batch_factory([1, 1, 1, 33, 130], [3, 700, 2500, 0, 1100], num_heads=num_heads,
                                num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size,
                                dtype=torch.bfloat16, device="cuda", generator=gen)
    _run(_arrange(batch, [3, 0, 4, 1, 2]), rel_err)


@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_head_sizes_and_dtypes(head_size, dtype, paged_batch_factory, rel_err):
    gen = torch.Generator().manual_seed(head_size + 7)
    batch = paged_batch_factory([1, 1, 40, 7], [100, 1500, 0, 300], num_heads=12, num_kv_heads=4,
                                head_size=head_size, block_size=16, dtype=dtype, device="cuda", generator=gen)
    _run(_arrange(batch, [2, 0, 3, 1]), rel_err)


# (block_m, block_n, num_warps, num_stages) overrides: fewer and more query tokens per tile than the default.
TILES = [(16, 16, 1, 1), (16, 64, 4, 2), (32, 32, 4, 3), (128, 64, 8, 2), (64, 128, 8, 2)]


@pytest.mark.parametrize("tile", TILES, ids=lambda t: "m{}-n{}-w{}-s{}".format(*t))
@pytest.mark.parametrize("groups", [(8, 8), (32, 8), (32, 4)], ids=lambda g: f"{g[0]}q{g[1]}kv")
def test_tile_overrides(tile, groups, paged_batch_factory, rel_err):
    num_heads, num_kv_heads = groups
    gen = torch.Generator().manual_seed(sum(tile) * 100 + num_heads)
    batch = paged_batch_factory([1, 1, 1, 19, 77, 200], [5, 800, 3000, 0, 450, 64], num_heads=num_heads,
                                num_kv_heads=num_kv_heads, head_size=128, block_size=16, dtype=torch.bfloat16,
                                device="cuda", generator=gen)
    _run(_arrange(batch, [4, 0, 3, 1, 5, 2]), rel_err, tile=tile)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_split_contexts_merge_exactly_and_reset_their_counters(dtype, paged_batch_factory, rel_err):
    """Long contexts split inside the launch (flash-decoding): decodes at 2k-33k tokens, a 3-token draft
    verification (its rows see different causal tails), a short decode and a prefill chunk over a long context
    (several query blocks: never split), under the default budget (66 extra programs wanted: the cap halves to 8),
    a tight one (to 4) and none. Each
    matches the reference; 30 launches of the default give the same bits (the merging program never reads a
    partial that is not yet written), and every merge counter is back at 0."""
    q_lens, ctx_lens = [1, 1, 1, 1, 1, 3, 40], [2047, 8190, 16000, 33000, 30, 12000, 9000]
    gen = torch.Generator().manual_seed(zlib.crc32(f"varlen-split-{dtype}".encode()))
    batch = paged_batch_factory(q_lens, ctx_lens, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                                dtype=dtype, device="cuda", generator=gen)
    step = _arrange(batch, [6, 0, 5, 1, 4, 2, 3])
    block_q, block_n = 16, 32 if dtype == torch.float32 else 64
    for split, wanted in ((VarlenSplit(), [1, 7, 8, 8, 1, 8, 8, 1, 1, 1]),
                          (VarlenSplit(min_chunk=256, max_splits=16, extra=20), [1, 4, 4, 4, 1, 4, 4, 1, 1, 1]),
                          (VarlenSplit(extra=0), [1] * 10)):
        plan = varlen_plan(step.query_start_loc, step.seq_lens, num_reqs=step.num_reqs, block_q=block_q,
                           block_n=block_n, split=split)
        assert plan[step.num_reqs + 1:2 * step.num_reqs + 1].tolist() == wanted, split
        _run(step, rel_err, split=split)
    first = None
    for _ in range(30):
        out = torch.full_like(step.query, SENTINEL)
        varlen_attention(step.query, step.kv_cache, step.block_table, step.seq_lens, step.query_start_loc, out,
                         num_reqs=step.num_reqs, scale=step.scale)
        first = out if first is None else first
        assert torch.equal(out, first)
    torch.cuda.synchronize()
    counters = [c for _, _, c in varlen_module._split_buffers.values()]
    assert counters and all(int(c.abs().sum()) == 0 for c in counters)


def test_padding_only_step_writes_nothing():
    """Every request a padding request (q_len 0 or seq_len 0): ``out`` stays as it was."""
    query = torch.randn(24, 8, 128, device="cuda").to(torch.bfloat16)
    kv_cache = torch.randn(2, 8, 16, 2, 128, device="cuda").to(torch.bfloat16)
    block_table = torch.randint(0, 8, (4, 4), dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([0, 30, 0, 0], dtype=torch.int32, device="cuda")
    query_start_loc = torch.tensor([0, 0, 0, 5, 5], dtype=torch.int32, device="cuda")
    out = torch.full_like(query, SENTINEL)
    varlen_attention(query, kv_cache, block_table, seq_lens, query_start_loc, out, num_reqs=4, scale=0.1)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full_like(out, SENTINEL))


def test_replays_in_cuda_graph(paged_batch_factory, rel_err):
    """Captured once for one mix of decodes and prefills, the launch stays correct, and equal to an eager launch,
    after the device tensors are refilled with other mixes of the same padded token and request counts."""
    num_heads, num_kv_heads, head_size, block_size = 32, 8, 128, 16
    num_tokens, num_reqs, width, pool = 96, 6, 256, 1024
    dtype = torch.bfloat16
    # (query_lens, context_lens, order, padding); the first is captured, the others replayed.
    mixes = [([1, 1, 40, 9], [100, 5, 0, 300], [0, 2, 1, 3], ((0, 0), (0, 0))),
             ([1, 1, 1, 1, 60], [2000, 1, 77, 500, 30], [4, 0, 1, 2, 3], ((0, 0),)),
             ([1] * 6, [3, 900, 16, 4000, 31, 0], [5, 4, 3, 2, 1, 0], ()),
             ([6, 90], [1000, 0], [1, 0], ((0, 0), (0, 50), (0, 0), (0, 0))),
             ([1, 1, 2, 3], [10, 2, 600, 0], [2, 0, 3, 1], ((0, 0), (4, 0)))]
    query = torch.zeros(num_tokens, num_heads, head_size, device="cuda", dtype=dtype)
    out = torch.empty_like(query)
    kv_cache = torch.zeros(2, pool, block_size, num_kv_heads, head_size, device="cuda", dtype=dtype)
    block_table = torch.zeros(num_reqs, width, dtype=torch.int32, device="cuda")
    seq_lens = torch.zeros(num_reqs, dtype=torch.int32, device="cuda")
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32, device="cuda")

    def load(index: int) -> Step:
        q_lens, ctx_lens, order, padding = mixes[index]
        batch = paged_batch_factory(q_lens, ctx_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                    head_size=head_size, block_size=block_size, dtype=dtype, device="cuda",
                                    generator=torch.Generator().manual_seed(200 + index))
        step = _arrange(batch, order, padding=padding, num_tokens=num_tokens)
        assert step.num_reqs == num_reqs and step.kv_cache.shape[1] <= pool
        query.copy_(step.query)
        kv_cache[:, : step.kv_cache.shape[1]].copy_(step.kv_cache)
        block_table.zero_()
        block_table[:, : step.block_table.shape[1]].copy_(step.block_table)
        seq_lens.copy_(step.seq_lens)
        query_start_loc.copy_(step.query_start_loc)
        out.fill_(SENTINEL)
        return step

    def launch() -> None:
        varlen_attention(query, kv_cache, block_table, seq_lens, query_start_loc, out, num_reqs=num_reqs,
                         scale=head_size ** -0.5)

    step = load(0)
    launch()  # compile outside the capture
    _check(step, out, rel_err)
    out.fill_(SENTINEL)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for index in range(len(mixes)):
        step = load(index)
        graph.replay()
        _check(step, out, rel_err)
        replayed = out.clone()
        out.fill_(SENTINEL)
        launch()
        torch.cuda.synchronize()
        assert torch.equal(out, replayed), f"mix {index}: the replay differs from an eager launch"


def test_step_values_compile_no_new_variant(paged_batch_factory, caplog):
    """The request count, the block table's width and the padded token count change from step to step outside
    the graphs; none of them may make Triton compile a new variant once serving (``compile_watch`` stays silent)."""
    from triton import knobs

    from brigade_cuda import compile_watch

    def step(q_lens, ctx_lens, seed, padding=PADDING):
        batch = paged_batch_factory(q_lens, ctx_lens, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                                    dtype=torch.bfloat16, device="cuda", generator=torch.Generator().manual_seed(seed))
        return _arrange(batch, list(range(len(q_lens))), padding=padding)

    first = step([1, 1, 20], [40, 300, 0], 1)
    later = [step([1], [5], 2, padding=()), step([1] * 16, [700] * 16, 3, padding=()),
             step([1, 1, 1, 64, 200], [9, 2000, 33, 0, 100], 4), step([17], [4000], 5, padding=((0, 0),))]
    before = knobs.runtime.jit_cache_hook
    try:
        compile_watch.watch()
        out = torch.full_like(first.query, SENTINEL)
        varlen_attention(first.query, first.kv_cache, first.block_table, first.seq_lens, first.query_start_loc,
                         out, num_reqs=first.num_reqs, scale=first.scale)
        torch.cuda.synchronize()
        compile_watch.mark_serving()
        with caplog.at_level(logging.WARNING, logger="brigade_cuda.compile_watch"):
            for s in later:
                out = torch.full_like(s.query, SENTINEL)
                varlen_attention(s.query, s.kv_cache, s.block_table, s.seq_lens, s.query_start_loc, out,
                                 num_reqs=s.num_reqs, scale=s.scale)
            torch.cuda.synchronize()
        assert [r.getMessage()[:120] for r in caplog.records] == []
    finally:
        knobs.runtime.jit_cache_hook = before
        compile_watch._watch = None
