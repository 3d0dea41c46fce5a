"""brigade-cuda's fused MoE kernels on the CPU, so CI checks their logic: ``moe_align_block_size`` (every
assignment once, each block one expert's, padding marked) and the two grouped GEMMs against
``fused_moe_reference`` in fp32, under Triton's interpreter (``TRITON_INTERPRET=1``) in a subprocess so the
interpreter mode stays out of this process. Shapes cover one token, uneven K and N, and more experts than tokens;
half types and timing run on CUDA (tests/cuda/test_fused_moe_cuda.py). The W8A16 variant (``FP8_W``: FP8 experts
with per-channel scales, quantized here by brigade-fp8's torch code, since the interpreter's own fp32 -> e4m3 cast
is not exact) against the reference path on the same FP8 weights, which dequantizes them. The top-k router kernel
(``brigade_cuda/ops/moe_router.py``) against ``TopKRouter.forward_native``: ids, weights, ties to the lower expert
id, and the expert-load counts of the real rows only. gpt-oss's variant: expert biases and the clamped SwiGLU
(``HAS_BIAS``, ``ACTIVATION``), with and without FP8 experts, and the router's top-k-then-softmax
(``SOFTMAX_AFTER``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_INTERPRETED = r"""
import torch
from brigade.model_executor.layers.fused_moe import fused_moe_reference
from brigade.model_executor.layers.moe_router import select_experts
from brigade_cuda.ops.fused_moe import MoETile, fused_moe, moe_align_block_size, pick_tile
from brigade_fp8.quantize import FP8_DTYPE, fp8_scale_from_amax, quantize_fp8_rows


def check(num_tokens, num_experts, top_k, hidden, inter, tile, seed=0):
    tile = tile or pick_tile(num_tokens, num_experts, hidden, inter, top_k)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter ** 0.5
    weights, ids = select_experts(torch.randn(num_tokens, num_experts, generator=gen), top_k, True)
    sorted_ids, expert_ids, num_post = moe_align_block_size(ids, num_experts, tile.block_m)
    used, padding = int(num_post), num_tokens * top_k
    assert used % tile.block_m == 0 and (sorted_ids[used:] == padding).all()
    real = sorted_ids[:used][sorted_ids[:used] < padding]
    assert sorted(real.tolist()) == list(range(padding))  # every assignment exactly once
    flat = ids.reshape(-1)
    for block in range(used // tile.block_m):
        rows = sorted_ids[block * tile.block_m:(block + 1) * tile.block_m]
        rows = rows[rows < padding].long()
        assert len(rows) and (flat[rows] == expert_ids[block]).all()  # no empty block; one expert per block
    got = fused_moe(x, w13, w2, weights, ids, tile=None if tile == pick_tile(num_tokens, num_experts, hidden, inter,
                                                                              top_k) else tile)
    want = fused_moe_reference(x, w13, w2, weights, ids)
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-5, (num_tokens, num_experts, top_k, err)


check(1, 8, 2, 64, 48, MoETile(16, 32, 32, 1, 4, 1))
check(7, 8, 2, 64, 48, MoETile(16, 32, 32, 1, 4, 1))
check(37, 6, 3, 40, 24, MoETile(16, 16, 16, 4, 4, 1))  # K and N not multiples of the tile
check(50, 16, 4, 32, 32, MoETile(32, 32, 16, 2, 4, 1))
check(3, 32, 8, 32, 16, MoETile(16, 16, 32, 1, 4, 1))  # more experts than assignments
check(40, 4, 2, 64, 64, None)  # the tile pick_tile chooses (32 rows)


def check_fp8(num_tokens, num_experts, top_k, hidden, inter, tile, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter ** 0.5
    w2[0, 3] = 0.0  # a channel of zeros keeps a positive scale and stays zero
    s13, s2 = fp8_scale_from_amax(w13.abs().amax(2)), fp8_scale_from_amax(w2.abs().amax(2))  # [E, 2I], [E, H]
    q13, q2 = quantize_fp8_rows(w13, s13), quantize_fp8_rows(w2, s2)
    assert q13.dtype == q2.dtype == FP8_DTYPE
    weights, ids = select_experts(torch.randn(num_tokens, num_experts, generator=gen), top_k, True)
    got = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2, tile=tile)
    want = fused_moe_reference(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    err = ((got - want).norm() / want.norm()).item()
    assert torch.isfinite(got).all() and err < 1e-5, (num_tokens, num_experts, top_k, err)
    # and it is the FP8 product, not the unquantized one: e4m3 rounding moves the output by a few percent
    unquantized = fused_moe_reference(x, w13, w2, weights, ids)
    assert 5e-3 < ((unquantized - want).norm() / want.norm()).item() < 0.1


check_fp8(1, 8, 2, 64, 48, MoETile(16, 32, 32, 1, 4, 1))
check_fp8(37, 6, 3, 40, 24, MoETile(16, 16, 16, 4, 4, 1))  # K and N not multiples of the tile
check_fp8(50, 16, 4, 32, 32, MoETile(32, 32, 16, 2, 4, 1))

from brigade.model_executor.layers.moe_activation import MoEActivation

OAI = MoEActivation("swigluoai", alpha=1.702, limit=7.0)


def check_oai(num_tokens, num_experts, top_k, hidden, inter, tile, fp8=False, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen) * 2
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen)  # gate and up reach past the limit
    w2 = torch.randn(num_experts, hidden, inter, generator=gen) / inter ** 0.5
    b13, b2 = torch.randn(num_experts, 2 * inter, generator=gen), torch.randn(num_experts, hidden, generator=gen)
    s13 = s2 = None
    if fp8:
        s13, s2 = fp8_scale_from_amax(w13.abs().amax(2)), fp8_scale_from_amax(w2.abs().amax(2))
        w13, w2 = quantize_fp8_rows(w13, s13), quantize_fp8_rows(w2, s2)
    weights, ids = select_experts(torch.randn(num_tokens, num_experts, generator=gen), top_k, True, True)
    kw = dict(w13_scale=s13, w2_scale=s2, w13_bias=b13, w2_bias=b2, activation=OAI)
    got = fused_moe(x, w13, w2, weights, ids, tile=tile, **kw)
    want = fused_moe_reference(x, w13, w2, weights, ids, **kw)
    err = ((got - want).norm() / want.norm()).item()
    assert torch.isfinite(got).all() and err < 1e-5, (num_tokens, num_experts, top_k, fp8, err)
    # the biases and the clamps are in it: SiLU without biases is another function
    plain = fused_moe_reference(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2)
    assert ((plain - want).norm() / want.norm()).item() > 0.1


check_oai(1, 8, 2, 64, 48, MoETile(16, 32, 32, 1, 4, 1))
check_oai(37, 6, 3, 40, 24, MoETile(16, 16, 16, 4, 4, 1))  # K and N not multiples of the tile
check_oai(50, 4, 2, 32, 32, MoETile(32, 32, 16, 2, 4, 1), fp8=True)

from brigade.model_executor.layers.moe_router import TopKRouter
from brigade_cuda.ops.moe_router import topk_router


def check_router(num_tokens, num_experts, top_k, renormalize, real, seed=2, softmax_after=False):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    logits[0, 1] = logits[0, 2] = logits[0].max() + 1  # a tie at the top: the lower id comes first
    counts_want = torch.randint(0, 5, (num_experts,), generator=gen)  # running totals of earlier steps
    counts_got, before = counts_want.clone(), counts_want.clone()
    num = torch.tensor(real)  # rows from `real` on are CUDA-graph padding: not counted
    want_w, want_ids = TopKRouter(top_k, renormalize, softmax_after).forward_native(logits, counts_want, num)
    got_w, got_ids = topk_router(logits, top_k, renormalize, counts_got, num, softmax_after)
    assert got_ids.dtype == torch.int64 and got_w.dtype == torch.float32
    assert torch.equal(got_ids[1:], want_ids[1:]), (got_ids, want_ids)
    assert sorted(got_ids[0].tolist()) == sorted(want_ids[0].tolist()) and got_ids[0, :2].tolist() == [1, 2][:top_k]
    assert torch.allclose(got_w.sort(dim=1).values, want_w.sort(dim=1).values, rtol=1e-5, atol=1e-7)
    assert torch.equal(counts_got, counts_want), (counts_got, counts_want)
    assert int((counts_got - before).sum()) == real * top_k  # the real rows' assignments, each once
    plain_w, plain_ids = topk_router(logits, top_k, renormalize, softmax_after_topk=softmax_after)  # no count
    assert torch.equal(plain_ids, got_ids) and torch.equal(plain_w, got_w)


check_router(5, 8, 2, True, 5)
check_router(7, 128, 8, False, 4)
check_router(3, 60, 4, True, 3)  # experts not a power of two
check_router(1, 8, 1, False, 1)
check_router(5, 8, 2, False, 5, softmax_after=True)  # gpt-oss: the top-k logits, then their softmax
check_router(4, 32, 4, False, 3, softmax_after=True)
check_router(1, 8, 1, False, 1, softmax_after=True)
nan_logits = torch.full((2, 8), float("nan"))  # a broken hidden state: ids stay in range, counts in bounds
counts = torch.zeros(8, dtype=torch.int64)
_, nan_ids = topk_router(nan_logits, 2, True, counts, torch.tensor(2))
assert ((nan_ids >= 0) & (nan_ids < 8)).all() and int(counts.sum()) == 4, (nan_ids, counts)
print("OK")
"""


def test_fused_moe_kernels_and_their_fp8_variant_match_the_reference_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-2000:] + proc.stderr[-4000:]
