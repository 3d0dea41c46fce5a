"""brigade-cuda's latent-attention decode kernel (``brigade_cuda/attention/mla_decode.py``) on the CPU, against
``LatentDecode.forward_native`` in fp32, under Triton's interpreter (``TRITON_INTERPRET=1``) in a subprocess so the
interpreter mode stays out of this process. Shapes: requests of uneven lengths (one token, within a block, across
several iteration tiles) over shuffled block tables, fewer heads than a program takes and more (two programs),
ranks and rotary widths that are and are not powers of two, block sizes 16 and 8."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_INTERPRETED = r"""
import torch
from brigade.model_executor.layers.mla_attention import LatentDecode
from brigade_cuda.attention.mla_decode import mla_decode_cuda


def check(seq_lens, *, heads, rank, rope, block_size, seed):
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks) + 2
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(len(seq_lens), max(blocks) + 1, dtype=torch.int32)
    used = 0
    for r, n in enumerate(blocks):
        table[r, :n] = perm[used:used + n]
        used += n
    cache = torch.randn(num_blocks, block_size, rank + rope, generator=gen)
    q_latent = torch.randn(len(seq_lens), heads, rank, generator=gen)
    q_pe = torch.randn(len(seq_lens), heads, rope, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    args = (q_latent, q_pe, cache, table, lens, 0.2, max(seq_lens))
    want = LatentDecode().forward_native(*args)
    got = mla_decode_cuda(None, *args)
    err = float((got.double() - want.double()).norm() / want.double().norm())
    assert torch.isfinite(got).all() and err < 1e-5, (seq_lens, heads, rank, rope, err)
    print(seq_lens, heads, rank, rope, block_size, f"relative error {err:.1e}")


check([1, 7, 40, 100], heads=4, rank=32, rope=8, block_size=16, seed=0)
check([33, 5], heads=20, rank=48, rope=12, block_size=8, seed=1)
check([64], heads=16, rank=64, rope=16, block_size=16, seed=2)
print("OK")
"""


def test_mla_decode_kernel_matches_the_reference_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("OK"), result.stdout
