"""The Triton attention backend's kernels on the CPU, so CI checks their logic: the KV write through the slot
mapping, the split-KV decode kernel and its merge, the varlen prefill kernel with cached context, and
``forward_rotary``'s fused rotary + KV-write kernel and the decode kernel that rotates and writes the new K/V
itself, each against the reference backend in fp32, under Triton's interpreter (``TRITON_INTERPRET=1``) in a
subprocess so the interpreter mode stays out of this process. fp32 only (the interpreter computes bf16 dots
wrongly, see tests/quant/test_gptq_format.py); half types and the timing run on CUDA (tests/cuda)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_HELPERS = r"""
import time
import torch
from brigade.attention.backend import AttentionMetadata
from brigade.attention.reference import ReferenceAttentionBackend
from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding
from brigade_cuda.attention.triton_backend import TritonAttentionBackend


def batch(q_lens, ctx_lens, *, num_heads, num_kv_heads, head_size, block_size, seed):
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens)]
    blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks) + 3
    width = max(blocks)
    perm = torch.randperm(num_blocks - 1, generator=gen).to(torch.int32) + 1
    table = torch.zeros(len(q_lens), width, dtype=torch.int32)
    used = 0
    for r, n in enumerate(blocks):
        table[r, :n] = perm[used:used + n]
        used += n
    kv = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=gen)
    n_tok = sum(q_lens)
    q = torch.randn(n_tok, num_heads, head_size, generator=gen)
    k = torch.randn(n_tok, num_kv_heads, head_size, generator=gen)
    v = torch.randn(n_tok, num_kv_heads, head_size, generator=gen)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    slots = []
    for r, (ql, c) in enumerate(zip(q_lens, ctx_lens)):
        for p in range(c, c + ql):
            slots.append(int(table[r, p // block_size]) * block_size + p % block_size)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    num_decodes = next((i for i, ql in enumerate(q_lens) if ql != 1), len(q_lens))
    md = AttentionMetadata(num_reqs=len(q_lens), num_actual_tokens=n_tok, max_query_len=max(q_lens),
                           max_seq_len=max(seq_lens), num_decodes=num_decodes, query_start_loc=qsl, seq_lens=lens,
                           block_table=table, slot_mapping=torch.tensor(slots, dtype=torch.int64),
                           query_start_loc_cpu=qsl, seq_lens_cpu=lens)
    return q, k, v, kv, md
"""

_INTERPRETED = _HELPERS + r"""

def check(name, q_lens, ctx_lens, *, num_heads, num_kv_heads, head_size, block_size=16, splits=2, seed=0):
    q, k, v, kv, md = batch(q_lens, ctx_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                            block_size=block_size, seed=seed)
    scale = head_size ** -0.5
    ref_cache = kv.clone()
    ref = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, scale).forward(q, k, v, ref_cache, md)
    got_cache = kv.clone()
    got = TritonAttentionBackend(num_heads, head_size, num_kv_heads, scale, decode_num_splits=splits).forward(
        q, k, v, got_cache, md)
    assert torch.equal(got_cache, ref_cache), (name, "KV write differs")
    assert torch.isfinite(got).all(), name
    err = float((got.double() - ref.double()).norm() / ref.double().norm())
    assert err < 1e-4, (name, err)
    print(name, f"relative error {err:.1e}")


def check_rotary(name, q_lens, ctx_lens, *, num_heads, num_kv_heads, head_size, splits=2, seed=0):
    # forward_rotary: the fused rotary + KV-write kernel (mixed steps) or, for pure decodes, the decode kernel
    # rotating and writing the new K/V itself, against the reference backend's rotary op then forward.
    q, k, v, kv, md = batch(q_lens, ctx_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                            block_size=16, seed=seed)
    positions = torch.cat([torch.arange(c, c + ql) for ql, c in zip(q_lens, ctx_lens)]).long()
    rope = RotaryEmbedding(head_size, head_size, 512, RopeParameters(rope_theta=10000.0))
    scale = head_size ** -0.5
    ref_cache, got_cache = kv.clone(), kv.clone()
    ref = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, scale).forward_rotary(
        positions, q.clone(), k.clone(), v, ref_cache, md, rope)
    got = TritonAttentionBackend(num_heads, head_size, num_kv_heads, scale, decode_num_splits=splits).forward_rotary(
        positions, q.clone(), k.clone(), v, got_cache, md, rope)
    cache_err = float((got_cache - ref_cache).abs().max())
    assert cache_err < 1e-5, (name, "KV write differs", cache_err)
    err = float((got.double() - ref.double()).norm() / ref.double().norm())
    assert torch.isfinite(got).all() and err < 1e-4, (name, err)
    print(name, f"relative error {err:.1e}")


def check_mixed_graph(name, q_lens, ctx_lens, *, num_heads, num_kv_heads, head_size, seed=0):
    # A mixed-step graph's metadata: every request through the varlen kernel, whose split plan the first layer
    # computes and every other layer of the step reuses (a new step's metadata gets a new one).
    import dataclasses

    q, k, v, kv, md = batch(q_lens, ctx_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                            block_size=16, seed=seed)
    scale = head_size ** -0.5
    ref_cache = kv.clone()
    ref = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, scale).forward(q, k, v, ref_cache, md)
    graph_md = dataclasses.replace(md, mixed_graph=True)
    layers = [TritonAttentionBackend(num_heads, head_size, num_kv_heads, scale) for _ in range(2)]
    outs = [layer.forward(q, k, v, kv.clone(), graph_md) for layer in layers]
    plans = list(graph_md.backend_state.values())
    assert len(plans) == 1 and layers[0]._step_plan(q, graph_md) is layers[1]._step_plan(q, graph_md) is plans[0]
    splits = plans[0][len(q_lens) + 1:2 * len(q_lens) + 1].tolist()
    assert max(splits) > 1, (name, "no request was split", splits)
    assert layers[0]._step_plan(q, dataclasses.replace(graph_md)) is not plans[0], "a new step reused a plan"
    for got in outs:
        err = float((got.double() - ref.double()).norm() / ref.double().norm())
        assert torch.isfinite(got).all() and err < 1e-4, (name, err)
    print(name, f"splits {splits}")


t0 = time.perf_counter()
check_mixed_graph("mixed-graph-split", [1, 1, 3, 9], [700, 1200, 600, 20], num_heads=8, num_kv_heads=2, head_size=32)
check("decodes", [1, 1, 1], [0, 20, 70], num_heads=4, num_kv_heads=2, head_size=32, splits=3)
check("prefills", [5, 19], [0, 0], num_heads=4, num_kv_heads=1, head_size=32)
check("mixed", [1, 1, 7, 12], [33, 5, 40, 0], num_heads=8, num_kv_heads=2, head_size=64, splits=2, seed=1)
check_rotary("rotary-decodes", [1, 1], [9, 50], num_heads=4, num_kv_heads=2, head_size=32, splits=2, seed=2)
check_rotary("rotary-mixed", [1, 6, 17], [30, 10, 0], num_heads=4, num_kv_heads=2, head_size=32, seed=3)
print(f"ok {time.perf_counter() - t0:.1f}s")
"""


def test_triton_backend_kernels_under_the_cpu_interpreter():
    """Decodes (3 splits), fresh prefills, a mix with prefix-cached chunks (GQA 4, head size 64), the two
    rotary paths (the same cache as the reference's write, to 1e-5 after rotation), and a mixed-step graph's
    varlen path with long contexts split by one plan that two layers share: outputs within 1e-4."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "ok" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])


_FP8 = _HELPERS + r"""
import dataclasses
import numpy as np
import triton.language as tl
from triton.runtime import interpreter
from brigade.attention.fp8_kv import quantize_kv

# The interpreter's own fp32 -> e4m3 cast rounds halfway cases up and drops the carry of a rounded-up mantissa into
# the exponent (31.9 becomes 16, 100 becomes 104; torch and the GPU's cvt.rn.satfinite give 32 and 96): that one
# conversion goes through torch here, so the comparison checks the kernels, not the interpreter's cast.
_interpreter_cast = interpreter._convert_float


def _convert_float(data, input_dtype, output_dtype, rounding_mode):
    if input_dtype == tl.float32 and output_dtype == tl.float8e4nv:
        fp8 = torch.from_numpy(np.ascontiguousarray(data)).to(torch.float8_e4m3fn)
        return fp8.view(torch.uint8).numpy().reshape(data.shape)
    return _interpreter_cast(data, input_dtype, output_dtype, rounding_mode)


interpreter._convert_float = _convert_float

K_SCALE, V_SCALE = 0.05, 0.02


def fp8_batch(q_lens, ctx_lens, *, num_heads, num_kv_heads, head_size, seed):
    q, k, v, kv, md = batch(q_lens, ctx_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
                            block_size=16, seed=seed)
    k[::5, :, :3] *= 40.0  # outliers past 448 * K_SCALE: the write saturates them
    cache = torch.stack([quantize_kv(kv[0], K_SCALE), quantize_kv(kv[1], V_SCALE)])
    return q, k, v, cache, md


def backends(num_heads, head_size, num_kv_heads, splits):
    ref = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, head_size ** -0.5)
    got = TritonAttentionBackend(num_heads, head_size, num_kv_heads, head_size ** -0.5, decode_num_splits=splits)
    for b in (ref, got):
        b.k_scale, b.v_scale = K_SCALE, V_SCALE
    return ref, got


def compare(name, ref, got, ref_cache, got_cache):
    assert got_cache.dtype == torch.float8_e4m3fn
    assert torch.equal(got_cache.view(torch.uint8), ref_cache.view(torch.uint8)), (name, "fp8 KV write differs")
    err = float((got.double() - ref.double()).norm() / ref.double().norm())
    assert torch.isfinite(got).all() and err < 1e-4, (name, err)
    print(name, f"relative error {err:.1e}")


def check(name, q_lens, ctx_lens, *, num_heads, num_kv_heads, head_size, splits=2, seed=0, mixed_graph=False):
    q, k, v, cache, md = fp8_batch(q_lens, ctx_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                   head_size=head_size, seed=seed)
    ref_b, got_b = backends(num_heads, head_size, num_kv_heads, splits)
    ref_cache, got_cache = cache.clone(), cache.clone()
    ref = ref_b.forward(q, k, v, ref_cache, md)
    if mixed_graph:  # every request through the varlen kernel, long contexts split
        md = dataclasses.replace(md, mixed_graph=True)
    got = got_b.forward(q, k, v, got_cache, md)
    if mixed_graph:
        plan = next(iter(md.backend_state.values()))
        assert max(plan[len(q_lens) + 1:2 * len(q_lens) + 1].tolist()) > 1, (name, "no request was split")
    compare(name, ref, got, ref_cache, got_cache)


def check_rotary(name, q_lens, ctx_lens, *, num_heads, num_kv_heads, head_size, splits=2, seed=0):
    q, k, v, cache, md = fp8_batch(q_lens, ctx_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                   head_size=head_size, seed=seed)
    positions = torch.cat([torch.arange(c, c + ql) for ql, c in zip(q_lens, ctx_lens)]).long()
    rope = RotaryEmbedding(head_size, head_size, 1024, RopeParameters(rope_theta=10000.0))
    ref_b, got_b = backends(num_heads, head_size, num_kv_heads, splits)
    ref_cache, got_cache = cache.clone(), cache.clone()
    ref = ref_b.forward_rotary(positions, q.clone(), k.clone(), v, ref_cache, md, rope)
    got = got_b.forward_rotary(positions, q.clone(), k.clone(), v, got_cache, md, rope)
    compare(name, ref, got, ref_cache, got_cache)


t0 = time.perf_counter()
check("fp8-decodes-split", [1, 1, 1], [0, 20, 70], num_heads=4, num_kv_heads=2, head_size=32, splits=3)
check("fp8-mixed", [1, 1, 7, 12], [33, 5, 40, 0], num_heads=8, num_kv_heads=2, head_size=64, seed=1)
check("fp8-mixed-graph-split", [1, 1, 3, 9], [700, 1200, 600, 20], num_heads=8, num_kv_heads=2, head_size=32,
      seed=2, mixed_graph=True)
check_rotary("fp8-rotary-decodes", [1, 1], [9, 50], num_heads=4, num_kv_heads=2, head_size=32, seed=3)
check_rotary("fp8-rotary-mixed", [1, 6, 17], [30, 10, 0], num_heads=4, num_kv_heads=2, head_size=32, seed=4)
print(f"ok {time.perf_counter() - t0:.1f}s")
"""


def test_fp8_kv_cache_kernels_under_the_cpu_interpreter():
    """A float8 e4m3 cache (``--kv-cache-dtype fp8``) with k_scale 0.05 and v_scale 0.02, and keys past 448 * k_scale,
    which saturate: the KV write (plain and fused with rotary), split-KV decode (3 splits, and rotating and writing
    the new K/V itself), varlen prefill with cached context, and a mixed-step graph's varlen path with long contexts
    split, each kernel's KV_FP8 variant. The cache must equal the reference backend's byte for byte, the outputs be
    within 1e-4 of its attention over the dequantized cache."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _FP8], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "ok" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
