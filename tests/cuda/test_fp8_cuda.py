"""GPU checks of brigade-fp8's W8A8 path (``brigade_fp8/gemm.py``, ``triton_quant.py``) and FP8 models on CUDA.

* The Triton per-token quantization against the PyTorch rule (``quantize.quantize_fp8_per_token``): the same row
  scales, the same e4m3 codes but for rare division-rounding ties (one step at most).
* ``fp8_block_gemm`` (block-scaled checkpoints, a dequantizing product) against its fp32 reference; and
  ``fp8_gemm_cuda`` (``torch._scaled_mm``, rowwise scales) against the dequantized reference
  ``(qx * sx) @ (qw * sw).T`` in fp32, on random inputs, for the Llama-3.1-8B projection shapes (qkv, o, gate_up,
  down) at M = 1 to 4096 (the Triton W8A8 GEMM up to 64 rows, ``_scaled_mm`` above), dynamic and static
  activations, with bias: relative error below 2e-2, never NaN.
* The W8A16 decode kernels (``brigade_fp8/decode_gemm.py``: the one-row GEMV, the tensor-core kernel at 2-16 rows)
  against the dequantized product ``x @ (qw * sw).T`` on the same shapes in bf16 at M = 1, 2, 8 and 16, per-channel
  and per-tensor scales, with bias and the residual epilogue, and SiLU-and-mul at one row: relative error below
  2e-2, never NaN.
* A small random Llama (hidden 256, heads of 64) on CUDA in fp32, online ``quantization="fp8"`` and as a
  compressed-tensors ``FP8_DYNAMIC`` checkpoint (the same FP8 weights): its layers bind ``fp8_gemm_cuda``, and the
  prompt logprobs of a fixed text stay within 0.1 nats of the CPU path (transformers on the checkpoint, which
  ``tests/quant/test_fp8_checkpoints.py`` shows Brigade's CPU path matches within 0.08), closer than to the
  unquantized model. And the same model online FP8 with at most 16 tokens a step, so that every FP8 product runs
  through the decode kernels: its greedy tokens equal transformers' on the dequantized weights (the function those
  kernels compute), batched and alone.

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda/test_fp8_cuda.py``.
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
from fp8_checkpoint import compressed_tensors_checkpoint  # noqa: E402
from tiny_llama import cuda_greedy_reference, tiny_llama_config  # noqa: E402

from brigade_fp8.decode_gemm import fp8_decode_gemm, fp8_residual_gemm, fp8_silu_mul_gemm  # noqa: E402
from brigade_fp8.gemm import fp8_gemm_cuda  # noqa: E402
from brigade_fp8.quantize import FP8_DTYPE, quantize_fp8_per_channel, quantize_fp8_per_token  # noqa: E402
from brigade_fp8.triton_quant import per_token_quant_fp8  # noqa: E402

# Llama-3.1-8B: (N, K) of the merged qkv, o, merged gate_up and down projections.
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


@pytest.mark.parametrize("m", [1, 8, 64, 512, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_per_token_quant_matches_pytorch(m, dtype):
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 4096, device="cuda", dtype=dtype, generator=gen) * 3
    x[0] = 0  # an all-zero row keeps its zeros
    q, s = per_token_quant_fp8(x)
    q_ref, s_ref = quantize_fp8_per_token(x)
    assert q.dtype == FP8_DTYPE and s.shape == (m, 1)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    diff = q.float() != q_ref.float()
    assert diff.float().mean().item() < 1e-3
    step = q_ref.float().abs() * 2.0 ** -3 + 2.0 ** -9  # one e4m3 step at that magnitude
    assert ((q.float() - q_ref.float()).abs() <= step * 1.01).all()
    assert torch.equal(q[0].float(), torch.zeros(4096, device="cuda"))


@pytest.mark.parametrize("n,k", SHAPES, ids=["qkv", "o", "gate_up", "down"])
@pytest.mark.parametrize("m", [1, 8, 24, 40, 64, 65, 512, 4096])
def test_fp8_gemm_matches_dequantized_reference(n, k, m):
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
    qw, sw = quantize_fp8_per_channel(w)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    for input_scale in (None, (x.float().abs().amax() / 448).reshape(1)):
        out = fp8_gemm_cuda(x, qw, sw, input_scale, bias)
        if input_scale is None:
            qx, sx = quantize_fp8_per_token(x)
        else:
            qx, sx = (x.float() / input_scale).clamp(-448, 448).to(FP8_DTYPE), input_scale.reshape(1, 1)
        ref = (qx.float() * sx) @ (qw.float() * sw[:, None]).T + bias.float()
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        assert not out.isnan().any()
        rel = ((out.float() - ref).norm() / ref.norm()).item()
        assert rel < 2e-2, rel


@pytest.fixture(scope="module")
def tiny_fp8(tmp_path_factory):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    # A gentle initializer: with 0.1 this 4-layer model amplifies FP8 rounding chaotically (its logprobs move by
    # 1.3 nats), which would leave nothing to compare.
    model = LlamaForCausalLM(tiny_llama_config(initializer_range=0.03)).eval()
    root = tmp_path_factory.mktemp("fp8")
    model.save_pretrained(root / "fp32")
    gen = torch.Generator().manual_seed(1)
    text = torch.randint(0, 512, (96,), generator=gen).tolist()
    calibration = [torch.randint(0, 512, (48,), generator=gen).tolist()]
    ct = compressed_tensors_checkpoint(model, root / "ct", "FP8_DYNAMIC", calibration)
    return root, text, _hf_logprobs(ct, text), _hf_logprobs(root / "fp32", text)


def _hf_logprobs(path, text: list[int]) -> torch.Tensor:
    """transformers' logprob of each token of ``text`` after the first, fp32 on the CPU (compressed-tensors
    checkpoints run with their activation quantization)."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = ref(torch.tensor([text])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(text[1:])[:, None])[:, 0]


@pytest.mark.parametrize("source", ["online", "compressed-tensors"])
def test_fp8_engine_on_cuda_matches_the_cpu_path(tiny_fp8, source):
    from brigade import LLM, SamplingParams

    root, text, want, unquantized = tiny_fp8
    kwargs = {"quantization": "fp8"} if source == "online" else {}
    path = root / ("fp32" if source == "online" else "ct")
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, kv_cache_memory_gib=2, max_model_len=512,
              **kwargs)
    model = llm.engine.core.executor.worker.model_runner.model
    assert model.model.layers[0].mlp.down_proj.quant_method.gemm is fp8_gemm_cuda  # prefill sizes
    assert model.model.layers[0].mlp.down_proj.quant_method.decode_gemm is fp8_decode_gemm  # 1-16 rows
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == FP8_DTYPE
    out = llm.generate([text], SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=0, ignore_eos=True),
                       use_tqdm=False)[0]
    got = torch.tensor([row[t].logprob for row, t in zip(out.prompt_logprobs[1:], text[1:])])
    assert not got.isnan().any()
    # The CPU path emulated with the GEMM's bf16 output rounding measured 0.057 here (0.034 without it); quantization
    # itself moves the logprobs by 0.14-0.16.
    err = (got.cpu() - want).abs().max().item()
    drift = (got.cpu() - unquantized).abs().max().item()
    assert err < 0.1 and err < drift, (err, drift)
    del llm, model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("m", [1, 64, 4096])
def test_block_scaled_product_matches_its_reference(m):
    from brigade_fp8.gemm import fp8_block_gemm
    from brigade_fp8.quantize import dequantize_fp8_blockwise, quantize_fp8_per_group

    gen = torch.Generator(device="cuda").manual_seed(m)
    n, k = 4096, 14336  # down_proj
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    qw = (torch.randn(n, k, device="cuda", generator=gen) * 100).clamp(-448, 448).to(FP8_DTYPE)
    scale = torch.rand(n // 128, k // 128, device="cuda", generator=gen) * 1e-3 + 1e-4
    out = fp8_block_gemm(x, qw, scale, (128, 128), None)
    qx, sx = quantize_fp8_per_group(x, 128)
    ref = (qx.float() * sx.repeat_interleave(128, dim=1)) @ dequantize_fp8_blockwise(qw, scale, (128, 128)).T
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any()
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("scale", ["channel", "tensor"])
@pytest.mark.parametrize("n,k", SHAPES, ids=["qkv", "o", "gate_up", "down"])
@pytest.mark.parametrize("m", [1, 2, 8, 16])
def test_decode_kernels_match_the_dequantized_reference(n, k, m, scale):
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    qw, sw = quantize_fp8_per_channel(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    if scale == "tensor":  # a merged layer's two per-tensor scales, expanded to their rows
        sw = torch.cat([torch.full((n // 2,), 2e-4), torch.full((n - n // 2,), 5e-4)]).cuda()
    dense = qw.float() * sw[:, None]
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    ref = x.float() @ dense.T + bias.float()
    out = fp8_decode_gemm(x, qw, sw, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert _rel(out, ref) < 2e-2
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) * ref.abs().mean()
    out = fp8_residual_gemm(x, qw, sw, bias, residual)
    assert _rel(out, ref + residual.float()) < 2e-2
    if m == 1 and k == 14336:  # the down projection reads silu(gate) * up
        gate_up = torch.randn(1, 2 * k, device="cuda", dtype=torch.bfloat16, generator=gen)
        act = (torch.nn.functional.silu(gate_up[:, :k].float()) * gate_up[:, k:].float()).to(torch.bfloat16)
        out = fp8_silu_mul_gemm(gate_up, qw, sw, None, residual=residual)
        assert _rel(out, act.float() @ dense.T + residual.float()) < 2e-2


def test_fp8_engine_decode_kernels_match_transformers_on_the_dequantized_weights(tiny_fp8):
    """Online FP8 with at most 16 tokens a step (chunked prefill): every FP8 product takes the W8A16 kernels, whose
    function is the model with weights ``qw * sw``; transformers runs that model in fp32 on CUDA as the reference."""
    from transformers import AutoModelForCausalLM

    from brigade import LLM, SamplingParams

    root = tiny_fp8[0]
    ref = AutoModelForCausalLM.from_pretrained(str(root / "fp32"), dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in ref.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                         layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                qw, sw = quantize_fp8_per_channel(proj.weight)  # what --quantization fp8 does per output row
                proj.weight.copy_(qw.float() * sw[:, None])
    ref.save_pretrained(root / "dequantized")
    del ref
    prompts, expected = cuda_greedy_reference(root / "dequantized", max_new_tokens=16)
    llm = LLM(str(root / "fp32"), quantization="fp8", dtype="float32", skip_tokenizer_init=True,
              kv_cache_memory_gib=2, max_model_len=512, max_num_batched_tokens=16)
    model = llm.engine.core.executor.worker.model_runner.model
    method = model.model.layers[0].mlp.down_proj.quant_method
    assert method.decode_gemm is fp8_decode_gemm and method.silu_mul_gemm is fp8_silu_mul_gemm
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == expected
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[:1], params, use_tqdm=False)] == expected[:1]
    del llm, model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("tile", [(4, 1024, 8, 1), (8, 512, 4, 3), (16, 256, 4, 2), (32, 256, 8, 4), (8, 1024, 4, 2)])
def test_every_fp8_gemv_tile_is_correct(tile):
    from brigade_cuda.ops.gemm import gemv

    x = torch.randn(1, 4096 + 64, device="cuda").to(torch.bfloat16)  # K not a multiple of 512: masked tail
    qw, sw = quantize_fp8_per_channel(torch.randn(3001, 4096 + 64, device="cuda"))  # N not a multiple of block_n
    assert _rel(gemv(x, qw, weight_scale=sw, tile=tile), x.float() @ (qw.float() * sw[:, None]).T) < 2e-2
