"""GPU checks of brigade-gptq's Triton GEMM (``brigade_gptq/triton_gemm.py``) and of GPTQ models on CUDA.

* The kernel against the PyTorch reference (``packing.dequantize`` to the activation dtype, then an fp32
  matmul) on random packed weights: 4 and 8 bits, contiguous and act-order groups, group sizes that do and do
  not divide the K block, v1 and v2 zeros, decode and prefill row counts, ragged N and K tails; relative error
  below 1e-2 in bf16/fp16 and 1e-3 in fp32, never NaN.
* Column slices (a merged layer whose projections have their own ``g_idx``) written into an output slice.
* A GPTQ ``QKVLinear`` built on CUDA binds the kernel and agrees with the PyTorch path.
* A small random Llama quantized by ``tests/quant/gptq_checkpoint.py``: Brigade on CUDA in fp32 (decode CUDA
  graphs and eager) gives transformers' greedy tokens on the dequantized weights.

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda/test_gptq_triton.py``.
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
from bench_gptq_gemm import TILES  # noqa: E402
from tiny_llama import assert_quantized_engine_matches, cuda_greedy_reference, tiny_llama_config  # noqa: E402
from gptq_checkpoint import GPTQSpec, quantize_model, write_dequantized_checkpoint, write_gptq_checkpoint  # noqa: E402

from brigade.model_executor.layers.linear import QKVLinear  # noqa: E402
from brigade_gptq.config import GPTQConfig  # noqa: E402
from brigade_gptq.packing import dequantize, pack_cols, pack_rows  # noqa: E402
from brigade_gptq.triton_gemm import gptq_gemm  # noqa: E402

LIMIT = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-3}


def _random_gptq(k: int, n: int, bits: int, group_size: int, act_order: bool, seed: int):
    """Packed random codes, zeros, fp16 scales and g_idx on CUDA: (qweight, qzeros, scales, g_idx)."""
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else -(-k // group_size)
    q = torch.randint(0, 2 ** bits, (k, n), generator=gen)
    z = torch.randint(0, 2 ** bits - 1, (groups, n), generator=gen)
    s = (torch.rand(groups, n, generator=gen) * 0.02 + 2e-3).half()
    g = (torch.arange(k) // (k if group_size == -1 else group_size)).to(torch.int32)
    if act_order:
        g = g[torch.randperm(k, generator=gen)]
    return pack_rows(q, bits).cuda(), pack_cols(z, bits).cuda(), s.cuda(), g.cuda()


LAYOUTS = [  # (bits, group_size, act_order, zero_offset)
    (4, 128, False, 1), (4, 128, True, 1), (8, -1, False, 0), (4, 32, False, 1), (8, 64, True, 1), (4, 48, False, 0),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay[0]}bit-g{lay[1]}-{'act' if lay[2] else 'noact'}-z{lay[3]}")
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (5, 1000, 576), (64, 1536, 1024), (300, 2048, 4096)])
def test_kernel_matches_the_dequantized_product(m, n, k, layout, dtype, rel_err):
    bits, group_size, act_order, zero_offset = layout
    qweight, qzeros, scales, g_idx = _random_gptq(k, n, bits, group_size, act_order, seed=m + n + k)
    x = torch.randn(m, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    w = dequantize(qweight, qzeros, scales, g_idx, bits=bits, zero_offset=zero_offset, dtype=dtype)  # [k, n]
    want = x.float() @ w.float() + bias.float()
    got = gptq_gemm(x, qweight, qzeros, scales, g_idx, bits=bits, zero_offset=zero_offset,
                    group_size=k if group_size == -1 else group_size, trivial_g_idx=not act_order, bias=bias)
    assert got.shape == (m, n) and got.dtype == dtype
    assert not got.isnan().any() and rel_err(got, want) < LIMIT[dtype]


@pytest.mark.parametrize("split_k", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", [(4, 128, True, 1), (8, 64, False, 0), (4, -1, False, 1)], ids=str)
def test_split_k_counts_match_the_dequantized_product(split_k, dtype, layout, rel_err):
    """Forced split counts at decode sizes (the down projection's tall K, a ragged N) with bias, and that a
    call with the same split twice gives the same bits (the partials are summed in a fixed order)."""
    bits, group_size, act_order, zero_offset = layout
    k, n = 14336, 1000
    qweight, qzeros, scales, g_idx = _random_gptq(k, n, bits, group_size, act_order, seed=split_k + bits)
    w = dequantize(qweight, qzeros, scales, g_idx, bits=bits, zero_offset=zero_offset, dtype=dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda").to(dtype)
        call = lambda: gptq_gemm(x, qweight, qzeros, scales, g_idx, bits=bits, zero_offset=zero_offset,  # noqa: E731
                                 group_size=k if group_size == -1 else group_size, trivial_g_idx=not act_order,
                                 bias=bias, split_k=split_k)
        got = call()
        assert not got.isnan().any() and rel_err(got, x.float() @ w.float() + bias.float()) < LIMIT[dtype]
        assert torch.equal(got, call())


@pytest.mark.parametrize("tile", TILES, ids=str)
def test_every_benchmarked_tile_is_correct(tile, rel_err):
    """Every tile benchmarks/kernels/bench_gptq_gemm.py times (``choose_tile`` picks among them)."""
    k, n = 1024 + 128, 1000  # a ragged last N tile
    qweight, qzeros, scales, g_idx = _random_gptq(k, n, 4, 128, False, seed=4)
    for m in (1, 40):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        w = dequantize(qweight, qzeros, scales, g_idx, bits=4, dtype=torch.bfloat16)
        for trivial in (True, False):
            got = gptq_gemm(x, qweight, qzeros, scales, g_idx, bits=4, zero_offset=1, group_size=128,
                            trivial_g_idx=trivial, tile=tile)
            assert rel_err(got, x.float() @ w.float()) < 1e-2, (m, trivial)


def test_column_slices_write_into_an_output_slice(rel_err):
    k, n, bits = 1024, 768, 4
    qweight, qzeros, scales, _ = _random_gptq(k, n, bits, 128, False, seed=1)
    x = torch.randn(9, k, device="cuda").to(torch.bfloat16)
    out = torch.full((9, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    perms = [torch.randperm(k, device="cuda") for _ in range(2)]
    g_all = [(torch.arange(k, device="cuda") // 128).to(torch.int32)[p] for p in perms]
    for (a, b), g in zip(((0, 512), (512, 768)), g_all):
        gptq_gemm(x, qweight[:, a:b], qzeros[:, a // 8:b // 8], scales[:, a:b], g, bits=bits, zero_offset=1,
                  group_size=128, trivial_g_idx=False, out=out[:, a:b])
        w = dequantize(qweight[:, a:b], qzeros[:, a // 8:b // 8], scales[:, a:b], g, bits=bits,
                       dtype=torch.bfloat16)
        assert rel_err(out[:, a:b], x.float() @ w.float()) < 1e-2
    assert not out.isnan().any()
    assert gptq_gemm(x[:0], qweight, qzeros, scales, g_all[0], bits=bits, zero_offset=1, group_size=128,
                     trivial_g_idx=False).shape == (0, n)


@pytest.mark.parametrize("own_g_idx", [False, True], ids=["shared_g_idx", "own_g_idx"])
def test_cuda_layer_binds_the_kernel_and_matches_the_pytorch_path(own_g_idx, monkeypatch, rel_err):
    hidden, head, heads, kv_heads = 512, 64, 8, 2
    cfg = GPTQConfig(4, 128, desc_act=True, sym=False)
    shards = {sid: _random_gptq(hidden, size * head, 4, 128, True, seed=i)
              for i, (sid, size) in enumerate(zip("qkv", (heads, kv_heads, kv_heads)))}
    if not own_g_idx:  # one act-order permutation for the three projections, as GPTQ makes it
        shards = {sid: (*tensors[:3], shards["q"][3]) for sid, tensors in shards.items()}

    def build():
        with torch.device("cuda"):
            layer = QKVLinear(hidden, head, heads, kv_heads, dtype=torch.bfloat16,
                              quant_method=cfg.get_linear_method("model.layers.0.self_attn.qkv_proj"))
        for sid, tensors in shards.items():
            for name, tensor in zip(("qweight", "qzeros", "scales", "g_idx"), tensors):
                param = getattr(layer, name)
                param.weight_loader(param, tensor, sid)
        layer.quant_method.process_weights_after_loading(layer)
        return layer

    fused = build()
    assert fused.quant_method.gemm is gptq_gemm
    assert len(fused.quant_method.segments) == (3 if own_g_idx else 1)
    monkeypatch.setenv("BRIGADE_GPTQ_TRITON", "0")
    plain = build()
    assert plain.quant_method.gemm is None
    for rows in (1, 37):
        x = torch.randn(rows, hidden, device="cuda").to(torch.bfloat16)
        assert rel_err(fused(x), plain(x).float()) < 1e-2


@pytest.fixture(scope="module")
def tiny_gptq(tmp_path_factory):
    """A random 4-layer Llama quantized to 4-bit g64 act-order asym: (gptq dir, prompts, HF greedy tokens on the
    dequantized weights in fp32 on CUDA)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny-gptq")
    LlamaForCausalLM(tiny_llama_config(initializer_range=0.05)).save_pretrained(root / "model")
    spec = GPTQSpec(bits=4, group_size=64, desc_act=True, sym=False)
    layers = quantize_model(root / "model", spec)
    gptq_dir = write_gptq_checkpoint(root / "model", root / "gptq", spec, layers=layers)
    prompts, expected = cuda_greedy_reference(write_dequantized_checkpoint(root / "model", root / "ref", layers))
    return str(gptq_dir), prompts, expected


@pytest.mark.parametrize("eager", [False, True], ids=["cudagraphs", "eager"])
def test_engine_on_cuda_equals_transformers_on_the_dequantized_weights(tiny_gptq, eager):
    assert_quantized_engine_matches(*tiny_gptq, gemm=gptq_gemm, eager=eager)
