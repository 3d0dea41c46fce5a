"""Sliding windows, logit soft-capping and sinks in the Triton backend's kernels, on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, in a subprocess so the interpreter mode stays out of this process), against
the reference backend in fp32: split-KV decode (one and three splits, and rotating and writing the new K/V
itself), eager mixed steps (decode kernel, then the prefill kernel over cached context), mixed-step graphs (the
varlen kernel, long contexts split inside it) and a float8 cache. Under a sliding window the cache holds NaN
before each request's window, so reading those keys at all (not only masking them) fails the check. fp32 only
(the interpreter computes bf16 dots wrongly); bf16 and the CUDA graphs run on a GPU
(tests/cuda/test_triton_attention_variants.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

_SCRIPT = r"""
import dataclasses
import sys
import time

import torch
from dense_attention import VARIANTS, make_step

from brigade.attention.fp8_kv import FP8_KV_DTYPE
from brigade.attention.reference import ReferenceAttentionBackend
from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding
from brigade_cuda.attention.triton_backend import TritonAttentionBackend

H, HKV, D, BS = 4, 2, 32, 16


def poison_before_windows(cache, md, reqs, window):
    # NaN in every cached key and value before the window of each request's first query: a kernel that reads
    # them (even to mask them) returns NaN, so the test shows they are skipped.
    for r, (ctx, _) in enumerate(reqs):
        for pos in range(max(ctx - window + 1, 0)):
            cache[:, int(md.block_table[r, pos // BS]), pos % BS] = float("nan")


def check(name, variant, reqs, *, splits=None, mixed_graph=False, rotary=False, fp8=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kwargs = VARIANTS[variant].backend_kwargs(H, gen)
    step = make_step(reqs, H=H, Hkv=HKV, D=D, bs=BS, dtype=torch.float32, gen=gen,
                     kv_dtype=FP8_KV_DTYPE if fp8 else None, k_scale=0.5 if fp8 else 1.0)
    ref_b = ReferenceAttentionBackend(H, D, HKV, D ** -0.5, **kwargs)
    got_b = TritonAttentionBackend(H, D, HKV, D ** -0.5, decode_num_splits=splits, **kwargs)
    if fp8:
        for b in (ref_b, got_b):
            b.k_scale = 0.5
    md = step.metadata
    got_md = dataclasses.replace(md, mixed_graph=True) if mixed_graph else md
    ref_cache, got_cache = step.kv_cache.clone(), step.kv_cache.clone()
    if kwargs["sliding_window"]:
        poison_before_windows(got_cache, md, reqs, kwargs["sliding_window"])
    if rotary:
        positions = torch.cat([torch.arange(c, c + n) for c, n in reqs]).long()
        rope = RotaryEmbedding(D, D, 1024, RopeParameters(rope_theta=10000.0))
        ref = ref_b.forward_rotary(positions, step.query.clone(), step.key.clone(), step.value, ref_cache, md, rope)
        got = got_b.forward_rotary(positions, step.query.clone(), step.key.clone(), step.value, got_cache, got_md,
                                   rope)
    else:
        ref = ref_b.forward(step.query, step.key, step.value, ref_cache, md)
        got = got_b.forward(step.query, step.key, step.value, got_cache, got_md)
    if mixed_graph:
        plan = next(iter(got_md.backend_state.values()))
        assert max(plan[len(reqs) + 1:2 * len(reqs) + 1].tolist()) > 1, (name, "no request was split")
    err = float((got.double() - ref.double()).norm() / ref.double().norm())
    assert torch.isfinite(got).all() and err < 1e-4, (name, variant, err)
    print(name, variant, f"relative error {err:.1e}")


t0 = time.perf_counter()
variants = sys.argv[1].split(",")
for variant in variants:
    check("decode-1-split", variant, [(90, 1), (37, 1), (5, 1), (0, 1)], splits=1)
    check("decode-3-splits", variant, [(90, 1), (37, 1), (5, 1), (0, 1)], splits=3, seed=1)
    check("rotary-decode", variant, [(70, 1), (16, 1)], splits=2, rotary=True, seed=2)
    check("eager-mixed", variant, [(75, 1), (3, 1), (0, 40), (0, 3), (50, 30), (13, 20)], splits=2, seed=3)
    check("mixed-graph", variant, [(700, 1), (40, 1), (0, 37), (64, 30), (300, 9)], mixed_graph=True, seed=4)
if "all" in variants:  # a float8 cache, with every variant at once
    check("fp8-eager-mixed", "all", [(75, 1), (3, 1), (0, 40), (50, 30)], splits=2, fp8=True, seed=5)
    check("fp8-mixed-graph", "all", [(700, 1), (0, 37), (64, 30)], mixed_graph=True, fp8=True, seed=6)
print(f"ok {time.perf_counter() - t0:.1f}s")
"""


@pytest.mark.parametrize("variants", ["plain,window,window_block", "softcap,sinks,all"])
def test_triton_variants_under_the_cpu_interpreter(variants):
    """Every variant of ``tests/dense_attention.py`` on every Triton path, within 1e-4 of the reference backend."""
    tests_dir = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, variants], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0 and "ok" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
