"""GPU checks of the fused Triton ops against the layers' own ``forward_native`` (the PyTorch oracle).

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda``.
Inputs are fresh random values; tolerance is relative error < 1e-2 (half types) / < 1e-3 (fp32).
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.model_executor.layers.activation import SiluAndMul  # noqa: E402
from brigade.model_executor.layers.layernorm import RMSNorm  # noqa: E402
from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding  # noqa: E402
from brigade_cuda.ops import fused_add_rms_norm, rms_norm, rotary_embedding, silu_and_mul  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
LLAMA3_ROPE = RopeParameters(rope_theta=500000.0, rope_type="llama3",
                             scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192})


def _randn(*shape, dtype):
    return torch.randn(*shape, device="cuda").to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 4096), (257, 4096), (33, 896), (7, 5120), (3, 100)])
def test_rms_norm_and_fused_add(num_tokens, hidden, dtype, rel_err):
    layer = RMSNorm(hidden, 1e-5, dtype=dtype).cuda()
    layer.weight.data = _randn(hidden, dtype=dtype)
    x, residual = _randn(num_tokens, hidden, dtype=dtype) * 3, _randn(num_tokens, hidden, dtype=dtype)
    ref = layer.forward_native(x.clone())
    out = rms_norm(x, layer.weight, 1e-5)
    assert rel_err(out, ref) < TOL[dtype]
    ref_x, ref_res = layer.forward_native(x.clone(), residual.clone())
    x_in, res_in = x.clone(), residual.clone()
    out_x, out_res = fused_add_rms_norm(x_in, res_in, layer.weight, 1e-5)
    assert out_x.data_ptr() == x_in.data_ptr() and out_res.data_ptr() == res_in.data_ptr()  # in place
    assert rel_err(out_x, ref_x) < TOL[dtype]
    assert rel_err(out_res, ref_res) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,d", [(1, 14336), (100, 14336), (13, 4864), (5, 37)])
def test_silu_and_mul(num_tokens, d, dtype, rel_err):
    x = _randn(num_tokens, 2 * d, dtype=dtype) * 4
    ref = SiluAndMul().forward_native(x)
    assert rel_err(silu_and_mul(x), ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("heads,head_size,rotary_dim", [((32, 8), 128, 128), ((14, 2), 64, 64),
                                                         ((8, 8), 128, 64), ((12, 4), 80, 80)])
def test_rotary_embedding_in_place(heads, head_size, rotary_dim, neox, dtype, rel_err):
    num_heads, num_kv_heads = heads
    rope = RotaryEmbedding(head_size, rotary_dim, 10000, LLAMA3_ROPE, is_neox_style=neox).cuda()
    num_tokens = 300
    # Q and K as column views of a fused QKV output, as the attention layer produces them.
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype)
    q = qkv[:, : num_heads * head_size]
    k = qkv[:, num_heads * head_size: (num_heads + num_kv_heads) * head_size]
    v_before = qkv[:, (num_heads + num_kv_heads) * head_size:].clone()
    positions = torch.randint(0, 10000, (num_tokens,), device="cuda")
    ref_q, ref_k = rope.forward_native(positions, q.clone(), k.clone())
    out_q, out_k = rotary_embedding(positions, q, k, head_size, rope.cos_sin_cache, is_neox_style=neox)
    assert out_q.data_ptr() == q.data_ptr()
    assert rel_err(out_q, ref_q) < TOL[dtype] and rel_err(out_k, ref_k) < TOL[dtype]
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_size:], v_before)  # V untouched
    q3 = _randn(num_tokens, num_heads, head_size, dtype=dtype)
    k3 = _randn(num_tokens, num_kv_heads, head_size, dtype=dtype)
    ref_q3, ref_k3 = rope.forward_native(positions, q3.clone(), k3.clone())
    rotary_embedding(positions, q3, k3, head_size, rope.cos_sin_cache, is_neox_style=neox)
    assert rel_err(q3, ref_q3) < TOL[dtype] and rel_err(k3, ref_k3) < TOL[dtype]


def test_layers_built_on_cuda_run_the_triton_ops(cuda_ops_registered, rel_err):
    with torch.device("cuda"):
        norm = RMSNorm(4096, 1e-5, dtype=torch.bfloat16)
        act = SiluAndMul()
        rope = RotaryEmbedding(128, 128, 4096, LLAMA3_ROPE)
    assert (norm.impl_name, act.impl_name, rope.impl_name) == ("cuda", "cuda", "cuda")
    norm.weight.data = _randn(4096, dtype=torch.bfloat16)
    x, residual = _randn(64, 4096, dtype=torch.bfloat16), _randn(64, 4096, dtype=torch.bfloat16)
    ref_x, ref_res = norm.forward_native(x.clone(), residual.clone())
    out_x, out_res = norm(x.clone(), residual.clone())
    assert rel_err(out_x, ref_x) < 1e-2 and rel_err(out_res, ref_res) < 1e-2
    gate_up = _randn(64, 2 * 1024, dtype=torch.bfloat16)
    assert rel_err(act(gate_up), act.forward_native(gate_up)) < 1e-2
    positions = torch.arange(64, device="cuda") * 50
    q, k = _randn(64, 32 * 128, dtype=torch.bfloat16), _randn(64, 8 * 128, dtype=torch.bfloat16)
    ref_q, ref_k = rope.forward_native(positions, q.clone(), k.clone())
    out_q, out_k = rope(positions, q, k)
    assert rel_err(out_q, ref_q) < 1e-2 and rel_err(out_k, ref_k) < 1e-2
