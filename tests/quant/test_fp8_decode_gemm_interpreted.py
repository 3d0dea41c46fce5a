"""brigade-fp8's W8A16 decode kernels (``brigade_fp8/decode_gemm.py`` on brigade-cuda's ``gemv`` and
``skinny_linear`` with an FP8 weight) on the CPU, under Triton's interpreter (``TRITON_INTERPRET=1``) in a
subprocess so the interpreter mode stays out of this process (as tests/quant/test_awq_triton_interpreted.py).

The reference is the dequantized product ``x @ (qw.float() * scale[:, None]).T`` in float64, with bias, the
residual add and SiLU-and-mul where the kernel fuses them; x is fp32 (the interpreter computes bf16 dots wrongly,
so bf16 runs on CUDA only: tests/cuda/test_fp8_cuda.py). Shapes: one row (the GEMV) and 2 to 16 rows (the
tensor-core kernel), ragged N and K, per-channel and per-tensor scales (a merged layer's per-shard scales). Then
an FP8 layer on the CPU bound to the kernels (registered for the "cpu" platform for the test): decode sizes go
through them, 17 rows fall back to the W8A8 product. In process: the kernel registration, the row rule, and the
shapes the kernels refuse; and the Triton W8A8 GEMM of CUDA's decode batches (``triton_gemm.w8a8_gemm``, with and
without split-K) against the same float64 product, and its tile choice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from brigade.plugins.kernels import KERNEL_OPS  # noqa: E402
from brigade_fp8.decode_gemm import fp8_decode_gemm, fp8_residual_gemm, fp8_silu_mul_gemm  # noqa: E402
from brigade_fp8.quantize import FP8_DTYPE  # noqa: E402

_INTERPRETED = r"""
import time

import torch
import torch.nn.functional as F

from brigade.model_executor.layers.linear import Linear, MergedColumnLinear
from brigade.plugins.kernels import registered_kernel
from brigade_cuda.ops.gemm import gemv, skinny_linear
from brigade_fp8.config import Fp8Config
from brigade_fp8.decode_gemm import fp8_decode_gemm, fp8_residual_gemm, fp8_silu_mul_gemm
from brigade_fp8.gemm import fp8_gemm_emulated
from brigade_fp8.quantize import quantize_fp8_per_channel

t0 = time.perf_counter()
gen = torch.Generator().manual_seed(0)


def fp8_weight(n, k, per_tensor=False):
    qw, s = quantize_fp8_per_channel(torch.randn(n, k, generator=gen) * 0.05)
    if per_tensor:  # two shards' per-tensor scales, expanded to their rows (as Fp8LinearMethod stores them)
        s = torch.cat([torch.full((n // 2,), 3e-4), torch.full((n - n // 2,), 7e-4)])
    return qw, s.float().contiguous()


def close(name, got, want, limit=1e-5):
    assert got.dtype == torch.float32 and got.shape == want.shape, (name, got.dtype, got.shape)
    assert torch.isfinite(got).all(), name
    rel = float((got.double() - want).norm() / want.norm())
    assert rel < limit, (name, rel)
    print(f"{name}: relative error {rel:.1e}")


def check(name, m, n, k, *, tile=None, bias=True, residual=False, silu=False, per_tensor=False):
    qw, s = fp8_weight(n, k, per_tensor)
    x = torch.randn(m, 2 * k if silu else k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    r = torch.randn(m, n, generator=gen) if residual else None
    a = F.silu(x[:, :k]) * x[:, k:] if silu else x
    want = a.double() @ (qw.double() * s.double()[:, None]).T
    want = want + (b.double() if bias else 0) + (r.double() if residual else 0)
    kw = {"bias": b, "residual": r, "weight_scale": s, "tile": tile}
    if m == 1:
        got = gemv(x, qw, silu_mul=silu, **kw)
    else:
        got = skinny_linear(x, qw, **kw)
    close(name, got, want)


# One row: the GEMV (default tile 8 x 512; small tiles for ragged N and K, several K steps).
check("gemv", 1, 48, 512)
check("gemv-ragged", 1, 37, 200, tile=(8, 64, 4, 1))
check("gemv-per-tensor-nobias", 1, 40, 256, tile=(16, 128, 4, 2), bias=False, per_tensor=True)
check("gemv-residual", 1, 52, 192, tile=(8, 64, 4, 1), residual=True)
check("gemv-silu", 1, 24, 160, tile=(8, 64, 4, 1), silu=True)
check("gemv-silu-residual", 1, 24, 128, tile=(4, 64, 4, 1), silu=True, residual=True, per_tensor=True)
# 2..16 rows: the tensor-core kernel (rows padded to 16).
check("skinny-m2", 2, 40, 256, tile=(32, 64, 4, 2))
check("skinny-m7-ragged", 7, 37, 200, tile=(16, 64, 4, 2), per_tensor=True)
check("skinny-m16-residual", 16, 48, 128, tile=(32, 64, 4, 2), residual=True, bias=False)

# An FP8 gate/up and down pair built on the CPU with the decode kernels registered for the "cpu" platform.
hidden, inter = 64, 96
ops = {"fp8_gemm": fp8_decode_gemm, "fp8_silu_mul_gemm": fp8_silu_mul_gemm, "fp8_residual_gemm": fp8_residual_gemm}
with registered_kernel("fp8_gemm", "cpu", ops["fp8_gemm"]), \
        registered_kernel("fp8_silu_mul_gemm", "cpu", ops["fp8_silu_mul_gemm"]), \
        registered_kernel("fp8_residual_gemm", "cpu", ops["fp8_residual_gemm"]):
    cfg = Fp8Config()
    gate_up = MergedColumnLinear(hidden, [inter, inter], dtype=torch.float32,
                                 quant_method=cfg.get_linear_method("model.layers.0.mlp.gate_up_proj"))
    down = Linear(inter, hidden, bias=True, dtype=torch.float32,
                  quant_method=cfg.get_linear_method("model.layers.0.mlp.down_proj"))
    for layer in (gate_up, down):
        layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.05)
        layer.quant_method.process_weights_after_loading(layer)
    down.bias.data.copy_(torch.randn(hidden, generator=gen))
assert down.quant_method.decode_gemm is fp8_decode_gemm and down.quant_method.silu_mul_gemm is fp8_silu_mul_gemm


def dense(layer):
    return layer.weight.double() * layer.weight_scale.double()[:, None]


for m in (1, 5, 16):
    x = torch.randn(m, hidden, generator=gen)
    res = torch.randn(m, hidden, generator=gen)
    h = gate_up(x)
    close(f"layer-gate-up-m{m}", h, x.double() @ dense(gate_up).T)
    act = F.silu(h[:, :inter]) * h[:, inter:]
    want = act.double() @ dense(down).T + down.bias.double()
    fused = down.forward_silu_mul(h, res)
    if m == 1:  # the GEMV computes the activation from h and adds the residual in its epilogue
        assert fused[1] is None, "the residual was left pending"
        close("layer-down-silu-residual-m1", fused[0], want + res.double())
    else:  # no SiLU fold in the tensor-core kernel: the caller runs the activation, then forward_add
        assert fused is None
    out, rest = down.forward_add(act, res)
    assert rest is None, "the residual was left pending"
    close(f"layer-down-residual-m{m}", out, want + res.double())
# The Triton W8A8 GEMM (brigade_fp8/triton_gemm.py) that runs W8A8 products of up to 64 rows on CUDA: FP8 codes
# on both sides, per-token and per-channel scales in the epilogue, split-K partials summed with the bias.
from brigade_fp8.quantize import quantize_fp8_per_token
from brigade_fp8.triton_gemm import w8a8_gemm

for m, n, k, tile in [(5, 48, 256, (16, 32, 64, 4, 2, 1)), (20, 40, 192, (32, 16, 64, 4, 2, 2)),
                      (64, 32, 320, (64, 32, 64, 4, 2, 4)), (3, 24, 200, (16, 16, 64, 4, 2, 2))]:
    qw, s = fp8_weight(n, k)
    qx, sx = quantize_fp8_per_token(torch.randn(m, k, generator=gen))
    b = torch.randn(n, generator=gen)
    want = (qx.double() * sx.double()) @ (qw.double() * s.double()[:, None]).T + b.double()
    close(f"w8a8-m{m}-split{tile[5]}", w8a8_gemm(qx, sx.contiguous(), qw, s, b, out_dtype=torch.float32, tile=tile),
          want)

x = torch.randn(17, hidden, generator=gen)  # above the decode rows: the W8A8 product (per-token FP8 activations)
want = fp8_gemm_emulated(x, gate_up.weight, gate_up.weight_scale, None, None)
assert torch.equal(gate_up(x), want)
print(f"ok {time.perf_counter() - t0:.1f}s")
"""


def test_decode_kernels_under_the_cpu_interpreter():
    """Nine kernel cases (one row and 2-16 rows, ragged shapes, per-channel and per-tensor scales, bias, residual,
    SiLU-and-mul) against the dequantized product in float64 (relative error < 1e-5 in fp32), and an FP8 MLP's
    layers bound to the kernels at 1, 5 and 16 rows, the W8A8 product at 17."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(Path(__file__).parent))
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


# ---- in process: registration, the row rule, refusals ---------------------------------------------------------

@pytest.mark.parametrize("rows,registered", [(None, True), ("16", True), ("1", True), ("0", False)])
def test_the_plugin_registers_its_decode_kernels_for_cuda(monkeypatch, rows, registered):
    from brigade_fp8 import plugin

    if rows is not None:
        monkeypatch.setenv("BRIGADE_FP8_DECODE_ROWS", rows)
    seen = []
    plugin.register_kernels(lambda op, platform, impl, **kw: seen.append((op, platform, impl)))
    fp8_ops = {op for op in KERNEL_OPS if op.startswith("fp8_")}
    assert {op for op, _, _ in seen} == (fp8_ops if registered else set())
    assert all(platform == "cuda" and impl.startswith("brigade_fp8.decode_gemm:") for _, platform, impl in seen)


def test_the_row_rule(monkeypatch):
    from brigade_fp8 import decode_gemm

    qw, s = torch.zeros(32, 64, dtype=FP8_DTYPE), torch.ones(32)
    for rows, took in (("16", [1, 2, 16]), ("1", [1]), ("40", [1, 2, 16])):  # at most 16: tl.dot's smallest M
        monkeypatch.setenv("BRIGADE_FP8_DECODE_ROWS", rows)
        decode_gemm.decode_rows.cache_clear()
        assert [m for m in (1, 2, 16, 17) if decode_gemm._takes(torch.zeros(m, 64), qw, s)] == took, rows
    decode_gemm.decode_rows.cache_clear()


def test_layouts_the_kernels_refuse_return_none():
    qw, s = torch.zeros(32, 64, dtype=FP8_DTYPE), torch.ones(32)
    x = torch.zeros(1, 64)
    assert fp8_decode_gemm(torch.zeros(17, 64), qw, s, None) is None  # prefill-sized: the W8A8 product
    assert fp8_decode_gemm(torch.zeros(0, 64), qw, s, None) is None
    assert fp8_decode_gemm(x, qw.float(), s, None) is None  # not an FP8 weight
    assert fp8_decode_gemm(x, qw, s.double(), None) is None  # scale not fp32
    assert fp8_decode_gemm(x, qw, torch.ones(32, 1), None) is None  # scale not [N]
    assert fp8_decode_gemm(torch.zeros(1, 128)[:, ::2], qw, s, None) is None  # x's last dimension strided
    assert fp8_silu_mul_gemm(torch.zeros(2, 128), qw, s, None) is None  # SiLU fold: one row only
    assert fp8_residual_gemm(x, qw, s, None, torch.zeros(1, 32, dtype=torch.float16)) is None  # residual dtype


def test_an_fp8_weight_takes_its_own_tiles_else_the_bf16_ones(tmp_path, monkeypatch):
    import json

    from brigade_cuda.ops import gemm

    table = {"tiles": {"64x32": [16, 32, 4, 2], "64x32/fp8": [32, 64, 4, 3]},
             "gemv_tiles": {"64x32": [4, 32, 4, 1], "64x32/silu_mul": [8, 32, 4, 1], "64x32/fp8": [16, 64, 8, 2],
                            "96x32": [4, 64, 4, 1]}}
    (tmp_path / "tiles.json").write_text(json.dumps(table))
    monkeypatch.setenv("BRIGADE_CUDA_GEMM_TILES", str(tmp_path / "tiles.json"))
    gemm.tile_tables.cache_clear()
    try:
        assert gemm._gemv_tile(64, 32, "", fp8=True) == (16, 64, 8, 2)
        assert gemm._gemv_tile(64, 32, "silu_mul", fp8=True) == (16, 64, 8, 2)  # no fp8_silu_mul entry: fp8's
        assert gemm._gemv_tile(64, 32, "silu_mul") == (8, 32, 4, 1)  # bf16 lookups ignore the FP8 entries
        assert gemm._gemv_tile(96, 32, "", fp8=True) == (4, 64, 4, 1)  # no FP8 entry: the bf16 tile of the shape
        assert gemm._gemv_tile(7, 7, "", fp8=True) == gemm.DEFAULT_GEMV_TILE
        assert gemm._tile(64, 32, fp8=True) == (32, 64, 4, 3) and gemm._tile(64, 32) == (16, 32, 4, 2)
    finally:
        gemm.tile_tables.cache_clear()


def test_the_w8a8_gemm_takes_the_table_tile_of_its_row_bucket_else_a_default_with_split_k():
    from brigade_fp8.triton_gemm import DEFAULT_TILES, pick_tile, tile_table

    table = tile_table()["4096x14336"]  # Llama-3.1-8B's down projection, tuned on the H200
    assert pick_tile(64, 4096, 14336) == table[64] and pick_tile(40, 4096, 14336) == table[64]
    assert pick_tile(17, 4096, 14336) == table[32] and pick_tile(500, 4096, 14336) == table[max(table)]
    # a shape the table lacks: the bucket's default, split while the tiles leave SMs idle and K has steps to split
    assert pick_tile(24, 5120, 8192) == DEFAULT_TILES[32][:5] + (4,)  # 80 tiles: 4 slices give 2 programs an SM
    assert pick_tile(24, 2048, 768) == DEFAULT_TILES[32][:5] + (1,)  # 6 K steps: not split
