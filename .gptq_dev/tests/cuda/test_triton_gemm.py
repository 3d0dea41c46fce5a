"""GPU checks of the skinny GEMM (decode-sized ``x @ W.T + b``) against an fp32 product, and its binding.

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda``.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from brigade.model_executor.layers.linear import Linear  # noqa: E402
from brigade_cuda.ops.activation import silu_and_mul  # noqa: E402
from brigade_cuda.ops.custom_ops import (dense_gemm_cuda, residual_gemm_cuda, rms_norm_gemm_cuda,  # noqa: E402
                                        silu_mul_gemm_cuda)
from brigade_cuda.ops.gemm import GEMV_TILES, gemv, skinny_linear  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 6144, 4096), (3, 1000, 4096), (16, 4096, 14336), (1, 100, 1000),
                                   (7, 49152, 576), (2, 33, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_matches_fp32_product(m, n, k, dtype, bias, rel_err):
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    want = x.float() @ w.float().T + (b.float() if bias else 0)
    got = skinny_linear(x, w, b)
    assert got.shape == (m, n) and got.dtype == dtype
    assert not got.isnan().any() and rel_err(got, want) < 1e-2


@pytest.mark.parametrize("tile", [(16, 128, 4, 3), (64, 512, 8, 3), (32, 256, 4, 6)])
def test_every_tile_shape_is_correct(tile, rel_err):
    x = torch.randn(5, 4096 + 64, device="cuda").to(torch.bfloat16)  # K not a multiple of 512: masked tail
    w = torch.randn(3000, 4096 + 64, device="cuda").to(torch.bfloat16)
    assert rel_err(skinny_linear(x, w, tile=tile), x.float() @ w.float().T) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 14336), (1000, 4096), (100, 1000), (49152, 576), (33, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_fp32_product(n, k, dtype, bias, rel_err):
    x = torch.randn(1, k, device="cuda").to(dtype)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    want = x.float() @ w.float().T + (b.float() if bias else 0)
    got = gemv(x, w, b)
    assert got.shape == (1, n) and got.dtype == dtype
    assert not got.isnan().any() and rel_err(got, want) < 1e-2


@pytest.mark.parametrize("n,k", [(4096, 14336), (896, 4864), (100, 1000)])
def test_gemv_with_silu_mul_matches_the_two_kernels(n, k, rel_err):
    gate_up = (torch.randn(1, 2 * k, device="cuda") * 3).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    b = torch.randn(n, device="cuda").to(torch.bfloat16)
    act = silu_and_mul(gate_up)
    got = gemv(gate_up, w, b, silu_mul=True)
    assert rel_err(got, act.float() @ w.float().T + b.float()) < 1e-2
    assert torch.equal(got, gemv(act, w, b))  # the same rounded activation, the same sum order
    assert silu_mul_gemm_cuda(gate_up, w, b) is not None
    assert silu_mul_gemm_cuda(torch.cat([gate_up, gate_up]), w, b) is None  # two rows: the caller runs two ops


@pytest.mark.parametrize("tile", [(4, 1024, 8, 1), (8, 512, 4, 3), (16, 256, 4, 2), (32, 256, 8, 4)]
                         + sorted(set(GEMV_TILES.values())))
def test_every_gemv_tile_is_correct(tile, rel_err):
    x = torch.randn(1, 4096 + 64, device="cuda").to(torch.bfloat16)  # K not a multiple of 512: masked tail
    w = torch.randn(3001, 4096 + 64, device="cuda").to(torch.bfloat16)  # N not a multiple of block_n
    assert rel_err(gemv(x, w, tile=tile), x.float() @ w.float().T) < 1e-2


@pytest.mark.parametrize("n,k", [(6144, 4096), (28672, 4096), (128256, 4096), (100, 1000), (33, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_with_rms_norm_matches_norm_then_product(n, k, bias, rel_err):
    """The RMSNorm (its weight folded into W) taken inside the GEMV: each program sums the squares itself."""
    x = (torch.randn(1, k, device="cuda") * 4 + 1).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    b = torch.randn(n, device="cuda").to(torch.bfloat16) if bias else None
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
    want = normed @ w.float().T + (b.float() if bias else 0)
    got = gemv(x, w, b, rms_norm_eps=1e-5)
    assert got.shape == (1, n) and not got.isnan().any() and rel_err(got, want) < 1e-2
    assert torch.equal(rms_norm_gemm_cuda(x, w, b, 1e-5), got)
    assert rms_norm_gemm_cuda(torch.cat([x, x]), w, b, 1e-5) is None  # two rows: norm kernel, then GEMM


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_residual_in_the_epilogue_matches_product_then_add(rows, bias, rel_err):
    """GEMV (1 row) and skinny GEMM (5) add the residual to the rounded product; at 40 rows there is no
    epilogue kernel (None): the model leaves the add to the next norm's fused add-and-normalize kernel."""
    n, k = 4096, 4096
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    b = torch.randn(n, device="cuda").to(torch.bfloat16) if bias else None
    r = (torch.randn(rows, n, device="cuda") * 3).to(torch.bfloat16)
    got = residual_gemm_cuda(x, w, b, r)
    if rows == 40:
        assert got is None
        return
    product = dense_gemm_cuda(x, w, b)
    assert got.shape == (rows, n) and not got.isnan().any()
    assert rel_err(got, r.float() + x.float() @ w.float().T + (b.float() if bias else 0)) < 1e-2
    if rows <= 16:  # same kernel, same sums: exactly the rounded product plus the residual
        assert torch.equal(got, (product.float() + r.float()).to(torch.bfloat16))


def test_gemv_silu_mul_with_residual_is_the_rounded_sum():
    k, n = 14336, 4096
    gate_up = (torch.randn(1, 2 * k, device="cuda") * 3).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    r = (torch.randn(1, n, device="cuda") * 3).to(torch.bfloat16)
    plain = gemv(gate_up, w, silu_mul=True)
    assert torch.equal(silu_mul_gemm_cuda(gate_up, w, None, residual=r), (plain.float() + r.float()).to(torch.bfloat16))


def test_refusals():
    x = torch.randn(17, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="at most 16"):
        skinny_linear(x, torch.randn(8, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="weight"):
        skinny_linear(x[:2], torch.randn(8, 32, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="exactly one row"):
        gemv(x[:2], torch.randn(8, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="weight"):
        gemv(x[:1], torch.randn(8, 64, device="cuda", dtype=torch.bfloat16), silu_mul=True)  # needs [1, 128]
    with pytest.raises(ValueError, match="residual"):
        gemv(x[:1], torch.randn(8, 64, device="cuda", dtype=torch.bfloat16), residual=x[:1, :4])
    with pytest.raises(ValueError, match="plain input"):
        gemv(torch.randn(1, 128, device="cuda", dtype=torch.bfloat16),
             torch.randn(8, 64, device="cuda", dtype=torch.bfloat16), silu_mul=True, rms_norm_eps=1e-5)


def test_dense_gemm_binding_routes_by_rows(rel_err, cuda_ops_registered):
    with torch.device("cuda"):
        layer = Linear(256, 512, bias=True, dtype=torch.bfloat16)
    assert layer.quant_method.gemm is dense_gemm_cuda
    layer.weight.data.normal_(0, 0.05)
    layer.bias.data.normal_()
    for rows in (1, 16, 17, 300):  # skinny kernel, then cuBLAS
        x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
        assert rel_err(layer(x), F.linear(x.float(), layer.weight.float(), layer.bias.float())) < 1e-2


@pytest.mark.parametrize("early", [False, True], ids=["trigger-after-wait", "trigger-before-wait"])
def test_pdl_chain_in_a_cuda_graph_matches_eager(early, monkeypatch):
    """The decode path's kernels, launched with programmatic dependent launch inside a captured graph,
    give exactly eager's results (each kernel waits for its predecessor before reading), whether a kernel
    lets its successor launch after or before its own wait."""
    from brigade_cuda import pdl
    from brigade_cuda.ops import fused_add_rms_norm, silu_and_mul  # noqa: F811
    from brigade_cuda.pdl import pdl_enabled, pdl_launch

    monkeypatch.setenv("BRIGADE_CUDA_PDL_EARLY", "1" if early else "0")
    pdl.pdl_early.cache_clear()

    if torch.cuda.get_device_capability()[0] >= 9:
        assert pdl_enabled()  # Hopper: the path under test is really on
    assert "launch_pdl" not in pdl_launch()  # never outside a capture
    bf16 = torch.bfloat16
    x0 = torch.randn(1, 4096, device="cuda").to(bf16)
    r0 = torch.randn(1, 4096, device="cuda").to(bf16)
    norm_w = torch.randn(4096, device="cuda").to(bf16)
    w1 = (torch.randn(28672, 4096, device="cuda") * 0.02).to(bf16)
    w2 = (torch.randn(4096, 14336, device="cuda") * 0.02).to(bf16)
    xs, rs = torch.empty_like(x0), torch.empty_like(r0)

    def chain():
        xs.copy_(x0)
        rs.copy_(r0)
        h, r = fused_add_rms_norm(xs, rs, norm_w, 1e-5)
        y = skinny_linear(silu_and_mul(skinny_linear(h, w1)), w2)
        y = fused_add_rms_norm(y, r, norm_w, 1e-5)[0]
        y = gemv(gemv(y, w1), w2, silu_mul=True)  # the one-row kernels in the chain too
        return fused_add_rms_norm(y, r, norm_w, 1e-5)[0]

    want = chain().clone()
    chain()  # warm up outside the capture (compiles the PDL variants' siblings too)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_kwargs = pdl_launch()
        out = chain()
    assert ("launch_pdl" in captured_kwargs) == pdl_enabled()
    assert captured_kwargs.get("PDL_EARLY", early) == early
    pdl.pdl_early.cache_clear()
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
