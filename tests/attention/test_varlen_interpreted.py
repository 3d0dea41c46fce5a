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
from brigade_cuda.attention.varlen import varlen_attention

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


def check(name, reqs, *, num_heads, num_kv_heads, head_size, pad_tokens, seed, tile=None):
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
    varlen_attention(query, kv_cache, block_table, torch.tensor(seq_lens, dtype=torch.int32), qsl, out,
                     num_reqs=len(reqs), scale=scale, tile=tile)
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
