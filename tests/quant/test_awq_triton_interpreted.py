"""brigade-awq's Triton GEMM (``brigade_awq/triton_gemm.py``) on the CPU, so CI checks its logic: the interleaved
nibble order, zero points, groups (one zero/scale row per K step, the K step lowered to divide the group, per-row
groups, one group for all of K), N and K tails, odd row counts, split-K and its summing kernel, bias, an ``out``
slice, and a q/k/v layer bound to the kernel, all under Triton's interpreter (``TRITON_INTERPRET=1``) in a
subprocess so the interpreter mode stays out of this process (as tests/attention/test_varlen_interpreted.py).
The reference is ``brigade_awq.packing.dequantize`` to x's dtype times x in float64. fp32, plus fp16 for two
cases; bf16 is left out: the interpreter computes bf16 dots wrongly (see tests/quant/test_gptq_format.py), so it
runs on CUDA only (tests/cuda/test_awq_triton.py). Also, in process: the kernel dispatch by device and
``BRIGADE_AWQ_TRITON``, the one WARNING without Triton, the tile and split-K rules, and the argument checks."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from brigade_awq import method  # noqa: E402
from brigade_awq.method import kernel_for_device  # noqa: E402
from brigade_awq.triton_gemm import awq_gemm, block_k_for_groups, choose_split_k, choose_tile  # noqa: E402

_INTERPRETED = r"""
import time

import torch
from awq_checkpoint import autoawq_pack, quantize_awq

from brigade.model_executor.layers.linear import QKVLinear
from brigade_awq.config import AWQConfig
from brigade_awq.packing import dequantize, pack
from brigade_awq.triton_gemm import awq_gemm

t0 = time.perf_counter()
gen = torch.Generator().manual_seed(0)
LIMIT = {torch.float32: 1e-5, torch.float16: 2e-3}


def random_awq(k, n, gs):
    groups = k // gs
    q = torch.randint(0, 16, (k, n), generator=gen)
    z = torch.randint(0, 16, (groups, n), generator=gen)
    s = (torch.rand(groups, n, generator=gen) * 0.02 + 2e-3).half()
    return pack(q), pack(z), s


def check(name, m, n, k, gs, dtype=torch.float32, tile=None, split_k=None, bias=True, out_slice=False):
    qw, qz, s = random_awq(k, n, gs)
    x = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    want = x.double() @ dequantize(qw, qz, s, group_size=gs, dtype=dtype).double()
    if bias:
        want += b.double()
    out = None
    if out_slice:  # columns 8..8+n of a wider buffer: a row stride that is not n
        wide = torch.full((m, n + 24), float("nan"), dtype=dtype)
        out = wide[:, 8:8 + n]
    got = awq_gemm(x, qw, qz, s, b, group_size=gs, tile=tile, split_k=split_k, out=out)
    assert got.shape == (m, n) and got.dtype == dtype, (name, got.shape, got.dtype)
    assert torch.isfinite(got).all(), name
    rel = float((got.double() - want).norm() / want.norm())
    assert rel < LIMIT[dtype], (name, rel)
    if out_slice:
        assert got.data_ptr() == out.data_ptr(), name
        assert wide[:, :8].isnan().all() and wide[:, 8 + n:].isnan().all(), (name, "wrote outside its slice")
    print(f"{name}: relative error {rel:.1e}")


# Default tiles (fp32: BLOCK_K 32, BLOCK_N 64; 16 rows up to M 16, 64 above).
check("decode-g32-ntail", 1, 200, 256, 32)  # N 200: the last 64-column tile is ragged
check("odd-m-g64", 7, 136, 256, 64)
check("prefill-g128", 33, 200, 384, 128)  # 33 rows: one 64-row tile, masked
check("m17-g64-nobias", 17, 72, 128, 64, bias=False)
check("split-k-default", 3, 64, 512, 128)  # choose_split_k picks 2 here (one tile, 16 steps)
# Tiles of the CUDA choices (BLOCK_K 128 or 64): the step lowered to divide the group, or one group for all of K.
check("bk128-g128", 3, 96, 256, 128, tile=(16, 32, 128, 4, 2))
check("bk128-g64-lowered", 4, 80, 256, 64, tile=(16, 16, 128, 4, 2))
check("bk64-g32-lowered", 3, 64, 160, 32, tile=(16, 32, 64, 4, 2))
check("bk128-gK-ktail", 5, 104, 192, 192, tile=(16, 32, 128, 4, 2))  # one group; K 192 = 1.5 steps
check("bk64-g48-to-16", 2, 64, 192, 48, tile=(16, 32, 64, 4, 2))  # 48: only 16 divides it
# Group sizes that no power of two from 16 up divides: per-row zero/scale loads, K tails.
check("per-row-g24", 2, 72, 192, 24)
check("per-row-g8-bk64", 6, 48, 64, 8, tile=(16, 16, 64, 4, 2))
# Split-K: even and uneven slices (5 steps in 3 slices), per-row groups, tails, no bias.
check("split4-g64", 1, 72, 1024, 64, split_k=4)
check("split4-uneven", 2, 48, 320, 64, tile=(16, 16, 64, 4, 2), split_k=4)
check("split2-per-row", 1, 40, 240, 24, split_k=2, bias=False)
check("split8-m16", 16, 32, 512, 32, split_k=8)
# An out slice (row stride n + 24), with and without split-K.
check("out-slice", 3, 40, 128, 32, out_slice=True)
check("out-slice-split", 1, 40, 256, 32, split_k=2, out_slice=True)
# fp16 activations (the weight rounded to fp16 once, fp32 accumulation).
check("fp16-g64", 5, 72, 128, 64, dtype=torch.float16, tile=(16, 32, 64, 4, 2))
check("fp16-split", 1, 64, 512, 128, dtype=torch.float16, tile=(16, 32, 64, 4, 2), split_k=2)
assert awq_gemm(torch.zeros(0, 64), *random_awq(64, 16, 32), group_size=32).shape == (0, 16)

# A q/k/v layer with bias bound to the kernel, packed by the test's AutoAWQ-style packer (independent of
# brigade_awq.packing): equal to the layer's PyTorch path and to the dense product.
hidden, head, heads, kv_heads, gs = 128, 16, 4, 2, 32
shards = {sid: quantize_awq(torch.randn(n * head, hidden, generator=gen), gs)
          for sid, n in zip("qkv", (heads, kv_heads, kv_heads))}
layer = QKVLinear(hidden, head, heads, kv_heads, bias=True, dtype=torch.float32,
                  quant_method=AWQConfig(4, gs).get_linear_method("model.layers.0.self_attn.qkv_proj"))
assert layer.quant_method.gemm is None  # built on the CPU: the PyTorch path
for sid, q in shards.items():
    for name, tensor in autoawq_pack(q).items():
        getattr(layer, name).weight_loader(getattr(layer, name), tensor, sid)
    layer.bias.weight_loader(layer.bias, torch.randn(q.scales.shape[1], generator=gen), sid)
layer.quant_method.process_weights_after_loading(layer)
x = torch.randn(5, hidden, generator=gen)
plain = layer(x)
layer.quant_method.gemm = awq_gemm  # what a CUDA device binds
fused = layer(x)
dense = torch.cat([q.dequantized() for q in shards.values()])
want = x.double() @ dense.double().T + layer.bias.double()
for name, got in (("fused", fused), ("plain", plain)):
    rel = float((got.double() - want).norm() / want.norm())
    assert rel < 1e-5, (name, rel)
print(f"ok {time.perf_counter() - t0:.1f}s")
"""


def test_kernel_logic_under_the_cpu_interpreter():
    """Twenty shapes (decode and prefill row counts, odd M, ragged N and K, group sizes 8 to K, split-K 2 to 8,
    out slices, fp32 and fp16) against dequantize-then-matmul in float64 (relative error < 1e-5 in fp32, 2e-3 in
    fp16), and a q/k/v layer bound to the kernel against its PyTorch path and the dense product."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(Path(__file__).parent))
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


# ---- in process: dispatch, tile rules, argument checks -------------------------------------------------

def test_kernel_dispatch_by_device(monkeypatch):
    assert kernel_for_device("cpu") is None and kernel_for_device("meta") is None
    monkeypatch.setenv("BRIGADE_AWQ_TRITON", "0")
    assert kernel_for_device("cuda") is None
    monkeypatch.setenv("BRIGADE_AWQ_TRITON", "1")
    assert kernel_for_device("cuda") is awq_gemm  # importable without a GPU


def test_without_triton_cuda_layers_fall_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "brigade_awq.triton_gemm", None)  # the import raises ImportError
    method._load_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="brigade_awq.method"):
            assert kernel_for_device("cuda") is None
            assert kernel_for_device("cuda") is None  # a second layer: no second warning
        warnings = [r for r in caplog.records if "Triton is not importable" in r.getMessage()]
        assert len(warnings) == 1 and "PyTorch" in warnings[0].getMessage()
    finally:
        method._load_kernel.cache_clear()


@pytest.mark.parametrize("block_k,group_size,groups,expected", [
    (128, 128, 32, (128, False)), (128, 64, 64, (64, False)), (128, 32, 4, (32, False)), (32, 128, 4, (32, False)),
    (128, 48, 4, (16, False)), (64, 24, 8, (64, True)), (128, 8, 8, (128, True)), (128, 4096, 1, (128, False)),
    (128, 576, 1, (128, False)),  # one group: any K step lies inside it
])
def test_block_k_for_groups(block_k, group_size, groups, expected):
    assert block_k_for_groups(block_k, group_size, groups) == expected


def test_tile_and_split_rules():
    assert choose_tile(1, 4096, torch.bfloat16) == (16, 32, 128, 4, 3)
    assert choose_tile(64, 4096, torch.float16) == (64, 64, 64, 4, 3)
    assert choose_tile(2048, 28672, torch.bfloat16) == (128, 256, 64, 8, 3)
    assert choose_tile(3, 64, torch.float32) == (16, 64, 32, 4, 2)
    # Llama-3.1-8B decode on 132 SMs: down (K 14336, 128 tiles) 4, qkv (192 tiles) 2, o (128 tiles) 4, gate_up 1
    assert choose_split_k(1, 4096, 14336, 16, 32, 128, 132) == 4
    assert choose_split_k(1, 6144, 4096, 16, 32, 128, 132) == 2
    assert choose_split_k(16, 4096, 4096, 16, 32, 128, 132) == 4
    assert choose_split_k(1, 28672, 4096, 16, 32, 128, 132) == 1  # 896 tiles: enough programs
    assert choose_split_k(17, 4096, 14336, 64, 64, 64, 132) == 1  # not decode-sized
    assert choose_split_k(1, 64, 256, 16, 64, 32, 132) == 1  # 8 steps: too short to split
    assert choose_split_k(3, 64, 512, 16, 64, 32, 132) == 2  # the interpreted "split-k-default" case
    assert choose_split_k(1, 32, 1 << 20, 16, 32, 128, 132) == 8  # at most 8
    assert choose_split_k(1, 4096, 4096, 16, 32, 128, 132, min_k=8192) == 1  # brigade-gptq's rule: K too short
    assert choose_split_k(1, 4096, 14336, 16, 32, 128, 132, min_k=8192) == 4


def test_bad_arguments_raise_before_launch():
    """Checked on the host (no launch, so no GPU or interpreter needed)."""
    x = torch.zeros(4, 128)
    qw = torch.zeros(128, 8, dtype=torch.int32)
    qz = torch.zeros(4, 8, dtype=torch.int32)
    s = torch.zeros(4, 64, dtype=torch.float16)

    def call(*, group_size=32, **changes):
        args = {"x": x, "qweight": qw, "qzeros": qz, "scales": s, **changes}
        return awq_gemm(args.pop("x"), args.pop("qweight"), args.pop("qzeros"), args.pop("scales"),
                        group_size=group_size, **args)

    assert call(x=torch.zeros(0, 128)).shape == (0, 64)  # an empty batch launches nothing
    for changes, match in [({"x": x.to(torch.int32)}, "activations"),
                           ({"x": torch.zeros(4, 96)}, "do not match"),
                           ({"group_size": 48}, "does not divide"),
                           ({"group_size": 64}, "do not match"),  # 2 groups, but scales have 4
                           ({"qzeros": torch.zeros(4, 4, dtype=torch.int32)}, "do not match"),
                           ({"scales": torch.zeros(4, 32, dtype=torch.float16)}, "do not match"),
                           ({"qweight": qw.to(torch.int64)}, "int32"),
                           ({"bias": torch.zeros(63)}, "bias"),
                           ({"qweight": torch.zeros(8, 128, dtype=torch.int32).t()}, "unit stride"),
                           ({"out": torch.zeros(4, 64, dtype=torch.float16)}, "out must be"),
                           ({"tile": (16, 12, 64, 4, 2)}, "multiple of 8"),
                           ({"tile": (16, 32, 8, 4, 2)}, "at least 16"),
                           ({"tile": (8, 32, 64, 4, 2)}, "at least 16"),
                           ({"split_k": 3}, "power of two")]:
        with pytest.raises(ValueError, match=match):
            call(**changes)
