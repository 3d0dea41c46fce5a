"""The varlen (mixed prefill/decode) Triton attention kernel on the CPU, so CI checks its indexing: the request
lookup by binary search over ``query_start_loc``, GQA heads packed into the tile rows (groups 1, 3 and 4), the
causal mask with cached context, padding requests and padded token rows left untouched, under Triton's
interpreter (``TRITON_INTERPRET=1``) in a subprocess so the interpreter mode stays out of this process. fp32
only: the interpreter computes bf16 dots wrongly (see tests/quant/test_gptq_format.py); half types run on CUDA
(tests/cuda/test_varlen_attention.py). Also the host-side tile rules and argument checks, in process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

from brigade_cuda.attention.varlen import varlen_attention, varlen_tile  # noqa: E402

_INTERPRETED = r"""
import time

import torch

from brigade.attention.backend import AttentionMetadata
from brigade.attention.reference import ReferenceAttentionBackend
from brigade_cuda.attention.varlen import VarlenSplit, varlen_attention, varlen_plan

SENTINEL = -7.25


def reference(query, kv_cache, block_table, q_lens, seq_lens, num_heads, scale):
    # The fp32 oracle, one request at a time (so any order of decodes and prefills is fine for it), on this
    # step's K/V read back from the cache; returns {request: [q_len, heads, head_size]}.
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    flat = kv_cache.view(2, -1, num_kv_heads, head_size)
    backend = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, scale)
    result, start = {}, 0
    for r, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        rows = slice(start, start + q_len)
        start += q_len
        if q_len == 0 or seq_len < q_len:
            continue
        pos = torch.arange(seq_len - q_len, seq_len)
        slots = block_table[r, pos // block_size].long() * block_size + pos % block_size
        qsl = torch.tensor([0, q_len], dtype=torch.int32)
        lens = torch.tensor([seq_len], dtype=torch.int32)
        md = AttentionMetadata(num_reqs=1, num_actual_tokens=q_len, max_query_len=q_len, max_seq_len=seq_len,
                               num_decodes=int(q_len == 1), query_start_loc=qsl, seq_lens=lens,
                               block_table=block_table[r:r + 1], slot_mapping=slots, query_start_loc_cpu=qsl,
                               seq_lens_cpu=lens)
        result[r] = backend.forward(query[rows], flat[0][slots], flat[1][slots], kv_cache.clone(), md)
    return result


def check(name, reqs, *, num_heads, num_kv_heads, head_size, pad_tokens, seed, tile=None,
          split=VarlenSplit(), expect_splits=None):
    # reqs: (q_len, seq_len) per request in the kernel's order, padding requests included.
    gen = torch.Generator().manual_seed(seed)
    block_size = 16
    q_lens = [q for q, _ in reqs]
    seq_lens = [s for _, s in reqs]
    blocks = [-(-s // block_size) for s in seq_lens]
    width = max(blocks) + 2
    num_blocks = sum(blocks) + 5
    # Every request's blocks scattered over a shuffled pool; unused entries point at random blocks.
    block_table = torch.randint(0, num_blocks, (len(reqs), width), generator=gen, dtype=torch.int32)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    used = 0
    for r, n in enumerate(blocks):
        block_table[r, :n] = perm[used:used + n]
        used += n
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=gen)
    num_real = sum(q_lens)
    query = torch.randn(num_real + pad_tokens, num_heads, head_size, generator=gen)
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    scale = head_size ** -0.5
    out = torch.full_like(query, SENTINEL)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    varlen_attention(query, kv_cache, block_table, lens, qsl, out, num_reqs=len(reqs), scale=scale, tile=tile,
                     split=split)
    if expect_splits is not None:  # the plan's split count per request (tile (16, 16, ...): BLOCK_Q 4, BLOCK_N 16)
        block_q = 16 // max(1, 1 << (num_heads // num_kv_heads - 1).bit_length())
        plan = varlen_plan(qsl, lens, num_reqs=len(reqs), block_q=block_q, block_n=16, split=split)
        got = plan[len(reqs) + 1:2 * len(reqs) + 1].tolist()
        assert got == expect_splits, (name, got, expect_splits)
    expected = reference(query, kv_cache, block_table, q_lens, seq_lens, num_heads, scale)
    written = torch.zeros(query.shape[0], dtype=torch.bool)
    worst = 0.0
    for r, ref in expected.items():
        rows = slice(int(qsl[r]), int(qsl[r + 1]))
        got = out[rows]
        assert torch.isfinite(got).all(), (name, r)
        err = float((got.double() - ref.double()).norm() / ref.double().norm())
        assert err < 1e-4, (name, r, err)
        worst = max(worst, err)
        written[rows] = True
    untouched = out[~written]
    assert torch.equal(untouched, torch.full_like(untouched, SENTINEL)), (name, "rows without a request were written")
    print(name, f"worst relative error {worst:.1e}")


t0 = time.perf_counter()
# Group 1 (64 query tokens per tile): a fresh prefill, decodes (one with no context), a prefix-cached chunk,
# then padding requests (q_len 0 with and without a context, and rows whose seq_len is 0) and padded rows.
check("group1", [(20, 20), (1, 41), (7, 40), (1, 1), (0, 0), (0, 12), (3, 0)], num_heads=2, num_kv_heads=2,
      head_size=64, pad_tokens=4, seed=1)
# Group 4 (16 tokens x 4 heads): decodes interleaved with prefills, one prefill spanning two query blocks.
check("group4", [(1, 71), (18, 18), (1, 4), (5, 55), (1, 17), (0, 0), (0, 0)], num_heads=8, num_kv_heads=2,
      head_size=32, pad_tokens=9, seed=2)
# Group 3 (padded to 4 head rows) with a head size that is not a power of two (48, masked to 64 lanes).
check("group3-d48", [(9, 30), (1, 33), (0, 0)], num_heads=6, num_kv_heads=2, head_size=48, pad_tokens=2, seed=3)
# Small tiles (4 tokens x 4 heads, 16-key steps): many query blocks per request and many key tiles per block,
# prefills first; the token count is no multiple of BLOCK_Q.
check("group4-small-tile", [(13, 150), (6, 6), (1, 90), (1, 2), (9, 40), (0, 30), (0, 0)], num_heads=4,
      num_kv_heads=1, head_size=16, pad_tokens=3, seed=4, tile=(16, 16, 4, 1))
# Split-KV (small tiles: BLOCK_Q 4, 16-key steps; at least 16 keys a split): decodes with long contexts, a
# three-token query (draft verification: the causal tail differs per row) and a prefill, which never splits.
# Wanted: 90 -> 5, 150 -> 8 (capped at 8), 57 -> 3, 200 (3-token query) -> 8; 20 extra programs are over the
# budget of 12, so the cap halves to 4 (extra 3 + 3 + 2 + 3 = 11).
check("split-capped", [(1, 90), (13, 150), (1, 150), (1, 57), (3, 200), (1, 10), (0, 0)], num_heads=4,
      num_kv_heads=1, head_size=16, pad_tokens=3, seed=5, tile=(16, 16, 4, 1),
      split=VarlenSplit(min_chunk=16, max_splits=8, extra=12), expect_splits=[4, 1, 4, 3, 4, 1, 1])
# Splits that round to nothing: 9 full key tiles in 8 splits of 32 keys (2 tiles) leave splits 5 and 6 empty
# (weight -inf in the merge); the last split still takes the causal tail. Group 4, two KV heads.
check("split-empty", [(1, 150), (2, 147), (0, 0)], num_heads=8, num_kv_heads=2, head_size=16, pad_tokens=1,
      seed=6, tile=(16, 16, 4, 1), split=VarlenSplit(min_chunk=16, max_splits=8, extra=16), expect_splits=[8, 8, 1])
# Run twice on the same buffers: the merge counters must be back at zero after a launch.
check("split-again", [(1, 150), (2, 147), (0, 0)], num_heads=8, num_kv_heads=2, head_size=16, pad_tokens=1,
      seed=7, tile=(16, 16, 4, 1), split=VarlenSplit(min_chunk=16, max_splits=8, extra=16), expect_splits=[8, 8, 1])
# No budget: nothing splits.
check("split-none", [(1, 150), (1, 90)], num_heads=4, num_kv_heads=1, head_size=16, pad_tokens=0, seed=8,
      tile=(16, 16, 4, 1), split=VarlenSplit(min_chunk=16, max_splits=8, extra=0), expect_splits=[1, 1])


def plan_reference(q_lens, seq_lens, block_q, block_n, split):
    # The plan as the kernel's docstring defines it, in Python.
    blocks, want = [], []
    for q, n in zip(q_lens, seq_lens):
        b = -(-q // block_q) if q > 0 and n >= q else 0
        blocks.append(b)
        want.append(max(min((n - q) // block_n * block_n // split.min_chunk, split.max_splits), 1) if b == 1 else 1)
    cap = split.max_splits
    while cap > 1 and sum(min(w, cap) - 1 for w in want) > split.extra:
        cap //= 2
    splits = [min(w, cap) for w in want]
    starts, slots, item, slot = [], [], 0, 0
    for b, s in zip(blocks, splits):
        starts.append(item)
        slots.append(slot)
        item += b * s
        slot += s if s > 1 else 0
    return starts + [item] + splits + slots


# The plan over more requests than the kernel's 256 lanes (prefix sums carried across chunks), several budgets.
gen = torch.Generator().manual_seed(9)
for num_reqs, extra in ((600, 64), (600, 5000), (257, 0), (3, 64)):
    q_lens = [int(x) for x in torch.randint(0, 40, (num_reqs,), generator=gen)]
    q_lens = [1 if x < 25 else x for x in q_lens]  # mostly decodes
    seq_lens = [q + int(torch.randint(0, 9000, (1,), generator=gen)) for q in q_lens]
    seq_lens[::7] = [0] * len(seq_lens[::7])  # padding requests
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    split = VarlenSplit(min_chunk=256, max_splits=16, extra=extra)
    got = varlen_plan(qsl, torch.tensor(seq_lens, dtype=torch.int32), num_reqs=num_reqs, block_q=16, block_n=64,
                      split=split).tolist()
    assert got == plan_reference(q_lens, seq_lens, 16, 64, split), (num_reqs, extra)
print(f"ok {time.perf_counter() - t0:.1f}s")
"""


def test_varlen_kernel_under_the_cpu_interpreter():
    """Mixes of decodes, fresh and prefix-cached prefills and padding (groups 1, 3, 4; head sizes 16 to 64;
    default and small tiles) against the reference backend in fp32, relative error < 1e-4 per request, and
    every row without a real request left as it was."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("dtype,head_size,group,tile,expected", [
    (torch.bfloat16, 128, 4, None, (16, 64, 64, 4, 2)),  # Llama-3-8B: 16 tokens x 4 heads
    (torch.bfloat16, 128, 1, None, (64, 64, 64, 4, 2)),
    (torch.float16, 64, 3, None, (16, 64, 64, 4, 2)),  # group 3 packs as 4
    (torch.bfloat16, 128, 8, None, (8, 64, 64, 4, 2)),
    (torch.bfloat16, 256, 4, None, (16, 64, 32, 8, 2)),  # wide heads: half the key tile, twice the warps
    (torch.float32, 128, 4, None, (16, 64, 32, 8, 2)),  # fp32 likewise
    (torch.bfloat16, 128, 128, None, (1, 128, 64, 4, 2)),  # a group wider than 64 rows: one token per tile
    (torch.bfloat16, 128, 4, (16, 32, 2, 3), (4, 16, 32, 2, 3)),
    (torch.bfloat16, 128, 32, (16, 32, 2, 3), (1, 32, 32, 2, 3)),
])
def test_tile_rules(dtype, head_size, group, tile, expected):
    assert varlen_tile(dtype, head_size, group, tile) == expected


@pytest.mark.parametrize("tile", [(8, 64, 4, 2), (48, 64, 4, 2), (64, 24, 4, 2)])
def test_bad_tiles_raise(tile):
    with pytest.raises(ValueError, match="power of two"):
        varlen_tile(torch.bfloat16, 128, 4, tile)


def test_bad_arguments_raise_before_launch():
    """Checked on the host (no launch, so no GPU or interpreter needed); lengths on the device are not."""
    query = torch.zeros(8, 8, 64)
    cache = torch.zeros(2, 4, 16, 2, 64)
    table = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    qsl = torch.zeros(3, dtype=torch.int32)
    out = torch.zeros_like(query)

    def call(**changes):
        args = {"query": query, "kv_cache": cache, "block_table": table, "seq_lens": lens, "query_start_loc": qsl,
                "out": out, "num_reqs": 2, "scale": 0.125, **changes}
        varlen_attention(**args)

    call(num_reqs=0)  # an empty step launches nothing
    for changes, match in [({"kv_cache": torch.zeros(2, 4, 16, 3, 64)}, "multiple"),
                           ({"kv_cache": torch.zeros(2, 4, 16, 2, 32)}, "head size"),
                           ({"out": torch.zeros(7, 8, 64)}, "shape"),
                           ({"kv_cache": cache.half()}, "dtype"),
                           ({"query": torch.zeros(8, 64, 8).transpose(1, 2)}, "contiguous"),
                           ({"block_table": torch.zeros(4, 2, dtype=torch.int32).t()}, "contiguous"),
                           ({"num_reqs": 3}, "exceeds"),
                           ({"num_reqs": -1}, "non-negative"),
                           ({"query": torch.zeros(8, 512)}, "expected")]:
        with pytest.raises(ValueError, match=match):
            call(**changes)
