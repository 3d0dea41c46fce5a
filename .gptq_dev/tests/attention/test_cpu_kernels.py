"""The compiled CPU decode kernel against the reference route, over the shapes models use, and its failure modes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from brigade.attention import cpu_kernels
from brigade.attention.reference import ReferenceAttentionBackend


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,block_size", [
    (9, 3, 64, 16),    # SmolLM2-135M
    (32, 8, 128, 16),  # Llama-3-8B
    (4, 4, 32, 32),    # no grouping
    (16, 1, 80, 128),  # multi-query, odd head size, big blocks
])
def test_decode_kernel_matches_reference(dtype, tol, num_heads, num_kv_heads, head_size, block_size):
    gen = torch.Generator().manual_seed(num_heads * 1000 + block_size)
    num_reqs, num_blocks = 11, 200
    lens = torch.randint(1, 6 * block_size, (num_reqs,), generator=gen, dtype=torch.int32)
    lens[0], lens[1] = 1, block_size  # one token, one exactly full block
    max_blocks = int(-(-lens.max() // block_size)) + 2
    table = torch.randperm(num_blocks - 1, generator=gen)[: num_reqs * max_blocks].add(1)
    table = table.view(num_reqs, max_blocks).to(torch.int32)
    cache = (torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=gen) * 2).to(dtype)
    query = torch.randn(num_reqs, num_heads, head_size, generator=gen).to(dtype)
    scale = head_size ** -0.5
    want = ReferenceAttentionBackend(num_heads, head_size, num_kv_heads, scale)._decode(query, cache, table, lens)
    got = cpu_kernels.decode_attention(query, cache, table, lens, scale, num_kv_heads)
    assert got.dtype == dtype and got.shape == query.shape and not got.isnan().any()
    assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max()


def test_kernel_refuses_what_it_cannot_do():
    cache = torch.zeros(2, 4, 16, 1, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="float32/bfloat16"):
        cpu_kernels.decode_attention(torch.zeros(1, 1, 64, dtype=torch.float16), cache, torch.zeros(1, 1, dtype=torch.int32),
                                     torch.ones(1, dtype=torch.int32), 0.125, 1)
    cache = torch.zeros(2, 4, 16, 1, 64)
    with pytest.raises(ValueError, match="limits"):  # 17 query heads per KV head is past the kernel's 16
        cpu_kernels.decode_attention(torch.zeros(1, 17, 64), cache, torch.zeros(1, 1, dtype=torch.int32),
                                     torch.ones(1, dtype=torch.int32), 0.125, 1)


BUILD_WITHOUT_COMPILER = """
import logging, sys, torch
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
from brigade.attention import cpu_kernels
from brigade.attention.cpu import CpuAttentionBackend
try:
    cpu_kernels.load()
except cpu_kernels.KernelBuildError as e:
    print("ERROR", e)
backend = CpuAttentionBackend(4, 32, 2, 32 ** -0.5)
CpuAttentionBackend(4, 32, 2, 32 ** -0.5)  # a second layer: no second warning
q = torch.randn(2, 4, 32); cache = torch.randn(2, 3, 16, 2, 32)
out = backend._decode(q, cache, torch.tensor([[1], [2]], dtype=torch.int32), torch.tensor([5, 16], dtype=torch.int32))
print("USE_KERNEL", backend.use_kernel, tuple(out.shape))
"""


def test_without_a_compiler_the_backend_warns_once_and_falls_back(tmp_path):
    env = {"PATH": "/nonexistent", "CC": str(tmp_path / "no-such-cc"), "BRIGADE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", BUILD_WITHOUT_COMPILER], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ERROR C compiler") and "no-such-cc" in lines[0]
    warnings = [ln for ln in lines if ln.startswith("WARNING")]
    assert len(warnings) == 1 and "compiled decode kernel unavailable" in warnings[0] and "reference" in warnings[0]
    assert lines[-1] == "USE_KERNEL False (2, 4, 32)"


SUBNORMALS_AFTER_LOAD = """
import numpy, torch
from brigade.attention import cpu_kernels
cpu_kernels.load()
tiny = numpy.float32(1e-39)  # subnormal
print(float(tiny * numpy.float32(0.5)) > 0.0, float(torch.tensor(1e-39) * 0.5) > 0.0)
"""


def test_loading_the_kernels_keeps_subnormals(tmp_path):
    """A library linked with -ffast-math would set flush-to-zero for the whole process when loaded."""
    env = {**os.environ, "BRIGADE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", SUBNORMALS_AFTER_LOAD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]


def test_build_is_cached_per_source(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIGADE_CACHE_DIR", str(tmp_path))
    cpu_kernels.load.cache_clear()
    try:
        cpu_kernels.load()
        built = list((tmp_path / "kernels").glob("cpu_attention-*.so"))
        assert len(built) == 1 and not list((tmp_path / "kernels").glob(".build-*"))  # no .o or temp left
        cpu_kernels.load.cache_clear()
        cpu_kernels.load()  # found, not rebuilt
        assert list((tmp_path / "kernels").glob("cpu_attention-*.so")) == built
    finally:
        cpu_kernels.load.cache_clear()
