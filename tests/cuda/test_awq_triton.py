"""GPU checks of brigade-awq's Triton GEMM (``brigade_awq/triton_gemm.py``) and of AWQ models on CUDA.

* The kernel against the PyTorch reference (``packing.dequantize`` to the activation dtype, then an fp32 matmul)
  on random packed weights: group sizes 32, 64, 128, 48 (the K step lowered to 16) and K (one group), decode and
  prefill row counts, ragged N (1000) and K (576) tails, bias; relative error below 1e-2 in bf16/fp16 and 1e-3 in
  fp32, never NaN.
* Every tile of ``benchmarks/kernels/bench_awq_gemm.py`` and every split-K it sweeps, per-row groups (group 24),
  an output slice.
* Row counts inside one ``choose_tile`` bucket compile no new variant (``do_not_specialize``).
* An AWQ ``QKVLinear`` built on CUDA binds the kernel and agrees with the PyTorch path.
* A small random Llama quantized by ``tests/quant/awq_checkpoint.py``: Brigade on CUDA in fp32 (decode CUDA
  graphs and eager) gives transformers' greedy tokens on the dequantized weights.

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda/test_awq_triton.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "quant"))
sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
from awq_checkpoint import autoawq_pack, quantize_awq  # noqa: E402
from bench_awq_gemm import SPLITS, TILES  # noqa: E402
from tiny_llama import assert_quantized_engine_matches, cuda_greedy_reference, tiny_llama_config  # noqa: E402

from brigade.model_executor.layers.linear import QKVLinear  # noqa: E402
from brigade_awq.config import AWQConfig  # noqa: E402
from brigade_awq.packing import dequantize, pack  # noqa: E402
from brigade_awq.triton_gemm import awq_gemm  # noqa: E402

LIMIT = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-3}


def _random_awq(k: int, n: int, group_size: int, seed: int):
    """Packed random codes and zeros, fp16 scales, on CUDA: (qweight, qzeros, scales)."""
    gen = torch.Generator().manual_seed(seed)
    groups = k // group_size
    q = torch.randint(0, 16, (k, n), generator=gen)
    z = torch.randint(0, 16, (groups, n), generator=gen)
    s = (torch.rand(groups, n, generator=gen) * 0.02 + 2e-3).half()
    return pack(q).cuda(), pack(z).cuda(), s.cuda()


def _reference(x, qweight, qzeros, scales, group_size, bias=None):
    w = dequantize(qweight, qzeros, scales, group_size=group_size, dtype=x.dtype)  # [K, N]
    want = x.float() @ w.float()
    return want if bias is None else want + bias.float()


SHAPES = [(1, 4096, 4096), (5, 1000, 576), (16, 4096, 14336), (64, 1536, 1536), (300, 2048, 4096)]  # (m, n, k)
CASES = [(m, n, k, gs) for m, n, k in SHAPES for gs in (128, 64, 32, 48, k) if k % gs == 0]  # gs == k: one group


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m,n,k,gs", CASES, ids=lambda v: str(v))
def test_kernel_matches_the_dequantized_product(m, n, k, gs, dtype, rel_err):
    qweight, qzeros, scales = _random_awq(k, n, gs, seed=m + n + k + gs)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    got = awq_gemm(x, qweight, qzeros, scales, bias, group_size=gs)
    assert got.shape == (m, n) and got.dtype == dtype
    assert not got.isnan().any() and rel_err(got, _reference(x, qweight, qzeros, scales, gs, bias)) < LIMIT[dtype]


@pytest.mark.parametrize("tile", TILES, ids=str)
def test_every_benchmarked_tile_and_split_is_correct(tile, rel_err):
    """Every tile and split benchmarks/kernels/bench_awq_gemm.py times (``choose_tile`` and ``choose_split_k``
    pick among them), with a ragged last N tile, at group 128 and at group 24 (per-row zero/scale loads)."""
    k, n = 1024 + 128, 1000
    for gs in (128, 24):
        qweight, qzeros, scales = _random_awq(k, n, gs, seed=4)
        for m in (1, 40):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            want = _reference(x, qweight, qzeros, scales, gs)
            for split in SPLITS:
                got = awq_gemm(x, qweight, qzeros, scales, group_size=gs, tile=tile, split_k=split)
                assert rel_err(got, want) < 1e-2, (gs, m, split)


def test_output_slice_and_empty_batch(rel_err):
    k, n = 1024, 768
    qweight, qzeros, scales = _random_awq(k, n, 128, seed=1)
    wide = torch.full((9, n + 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    x = torch.randn(9, k, device="cuda").to(torch.bfloat16)
    for split in (1, 4):
        out = wide[:, 32:32 + n]
        assert awq_gemm(x, qweight, qzeros, scales, group_size=128, out=out, split_k=split).data_ptr() == out.data_ptr()
        assert rel_err(out, _reference(x, qweight, qzeros, scales, 128)) < 1e-2
        assert wide[:, :32].isnan().all() and wide[:, 32 + n:].isnan().all()
    assert awq_gemm(x[:0], qweight, qzeros, scales, group_size=128).shape == (0, n)


def test_row_counts_in_one_bucket_compile_nothing_new():
    """After one call per ``choose_tile`` row bucket (decode with split-K, 17 to 64, more), other row counts in
    the same buckets reuse the compiled variants: ``M`` and the split-K workspace stride are not specialized.
    N = 1000 is not a multiple of 16, so an ``M * N`` stride would change its divisibility with M's parity."""
    from triton import knobs

    k, n, gs = 4096, 1000, 128
    qweight, qzeros, scales = _random_awq(k, n, gs, seed=2)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    compiled = []
    before = knobs.runtime.jit_cache_hook

    def hook(**kwargs):
        compiled.append(kwargs.get("repr"))
        return before(**kwargs) if before is not None else None

    def run(m):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        awq_gemm(x, qweight, qzeros, scales, bias, group_size=gs)

    for m in (1, 17, 65):  # one of each bucket, compiled here if not before
        run(m)
    knobs.runtime.jit_cache_hook = hook
    try:
        for m in (2, 3, 7, 8, 15, 16, 18, 33, 63, 64, 66, 127, 300, 1001):
            run(m)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_cache_hook = before
    assert compiled == [], compiled


def test_cuda_layer_binds_the_kernel_and_matches_the_pytorch_path(monkeypatch, rel_err):
    hidden, head, heads, kv_heads, gs = 512, 64, 8, 2, 128
    cfg = AWQConfig(4, gs)
    gen = torch.Generator().manual_seed(5)
    shards = {sid: autoawq_pack(quantize_awq(torch.randn(size * head, hidden, generator=gen), gs))
              for sid, size in zip("qkv", (heads, kv_heads, kv_heads))}
    biases = {sid: torch.randn(t["scales"].shape[1], generator=gen) for sid, t in shards.items()}

    def build():
        with torch.device("cuda"):
            layer = QKVLinear(hidden, head, heads, kv_heads, bias=True, dtype=torch.bfloat16,
                              quant_method=cfg.get_linear_method("model.layers.0.self_attn.qkv_proj"))
        for sid, tensors in shards.items():
            for name, tensor in tensors.items():
                param = getattr(layer, name)
                param.weight_loader(param, tensor.cuda(), sid)
            layer.bias.weight_loader(layer.bias, biases[sid].cuda().to(torch.bfloat16), sid)
        layer.quant_method.process_weights_after_loading(layer)
        return layer

    fused = build()
    assert fused.quant_method.gemm is awq_gemm
    monkeypatch.setenv("BRIGADE_AWQ_TRITON", "0")
    plain = build()
    assert plain.quant_method.gemm is None
    for rows in (1, 37):
        x = torch.randn(rows, hidden, device="cuda").to(torch.bfloat16)
        assert rel_err(fused(x), plain(x).float()) < 1e-2


@pytest.fixture(scope="module")
def tiny_awq(tmp_path_factory):
    """A random 4-layer Llama quantized to AWQ 4-bit g64: (awq dir, prompts, HF greedy tokens on the dequantized
    weights in fp32 on CUDA)."""
    from awq_checkpoint import quantize_model, write_awq_checkpoint
    from gptq_checkpoint import write_dequantized_checkpoint
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny-awq")
    LlamaForCausalLM(tiny_llama_config(initializer_range=0.05)).save_pretrained(root / "model")
    layers = quantize_model(root / "model", 64)
    awq_dir = write_awq_checkpoint(root / "model", root / "awq", 64, layers)
    prompts, expected = cuda_greedy_reference(write_dequantized_checkpoint(root / "model", root / "ref", layers))
    return str(awq_dir), prompts, expected


@pytest.mark.parametrize("eager", [False, True], ids=["cudagraphs", "eager"])
def test_engine_on_cuda_equals_transformers_on_the_dequantized_weights(tiny_awq, eager):
    """Decode steps take split-K in down_proj here (K 512: 16 steps of 32 rows in fp32, 4 output tiles)."""
    assert_quantized_engine_matches(*tiny_awq, gemm=awq_gemm, eager=eager)
