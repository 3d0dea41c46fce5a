"""A Llama model on the GPU with the Triton fast path (Triton attention + fused ops through the CustomOp
seam) against the same weights on the PyTorch path (reference attention + forward_native), step by step.

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda``.
"""

from __future__ import annotations

import pytest
import torch
import transformers

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.attention.backend import AttentionContext  # noqa: E402
from brigade.attention.reference import ReferenceAttentionBackend  # noqa: E402
from brigade.model_executor.models.llama import LlamaForCausalLM  # noqa: E402
from brigade.model_executor.weight_utils import initialize_dummy_weights  # noqa: E402
from brigade_cuda.attention import TritonAttentionBackend  # noqa: E402

CONFIG = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=8,
              num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 1024},
              architectures=["LlamaForCausalLM"])
# A mixed step (two decodes, a fresh prefill, a prefix-cached chunk), a pure decode step, then one decode
# alone (the one-row GEMVs, SiLU-and-mul folded into the down projection).
STEPS = [([1, 1, 40, 9], [30, 700, 0, 100]), ([1, 1, 1], [71, 5, 1500]), ([1], [300])]


@pytest.mark.parametrize("fold", [False, True], ids=["norms", "folded"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_fast_path_matches_pytorch_path(dtype, tol, fold, cuda_ops_registered, paged_batch_factory, rel_err,
                                        monkeypatch):
    from brigade_cuda.ops import custom_ops

    folds = []
    real = custom_ops.gemv
    monkeypatch.setattr(custom_ops, "gemv", lambda *a, **kw: (
        folds.append((kw.get("silu_mul", False), kw.get("rms_norm_eps") is not None, kw.get("residual") is not None)),
        real(*a, **kw))[1])
    hf_config = transformers.LlamaConfig(**CONFIG)
    torch.manual_seed(0)
    # The PyTorch path binds forward_native: its ops are built on the CPU, then moved.
    slow = LlamaForCausalLM(hf_config, dtype=dtype, attn_backend=ReferenceAttentionBackend)
    initialize_dummy_weights(slow, seed=0, std=0.05)
    slow = slow.cuda().eval()
    with torch.device("cuda"):
        fast = LlamaForCausalLM(hf_config, dtype=dtype, attn_backend=TritonAttentionBackend).eval()
    fast.load_state_dict(slow.state_dict())
    if fold:  # what the loader does on CUDA: norm weights into the projections, the norms then run in the GEMVs
        assert fast.fold_norm_weights() == 2 * hf_config.num_hidden_layers + 1
    # The truth both paths are measured against: the same weights on the PyTorch path in fp32.
    exact = LlamaForCausalLM(hf_config, dtype=torch.float32, attn_backend=ReferenceAttentionBackend)
    exact.load_state_dict(slow.state_dict())
    exact = exact.cuda().eval()
    impls = {type(m).__name__: m.impl_name for m in fast.modules() if hasattr(m, "impl_name")}
    assert set(impls.values()) == {"cuda"}, impls
    assert {m.impl_name for m in slow.modules() if hasattr(m, "impl_name")} == {"native"}
    gen = torch.Generator().manual_seed(5)
    for query_lens, context_lens in STEPS:
        batch = paged_batch_factory(query_lens, context_lens, num_heads=8, num_kv_heads=2, head_size=64,
                                    block_size=16, dtype=dtype, device="cuda", generator=gen)
        positions = torch.cat([torch.arange(c, c + q) for q, c in zip(query_lens, context_lens)]).cuda()
        input_ids = torch.randint(0, hf_config.vocab_size, (positions.shape[0],), generator=gen).cuda()
        caches = [batch.kv_cache * (i + 1) for i in range(hf_config.num_hidden_layers)]
        with torch.inference_mode():
            ref = slow.compute_logits(slow(input_ids, positions, AttentionContext(
                batch.metadata, [c.clone() for c in caches])))
            truth = exact.compute_logits(exact(input_ids, positions, AttentionContext(
                batch.metadata, [c.float() for c in caches])))
            out = fast.compute_logits(fast(input_ids, positions, AttentionContext(batch.metadata, caches)))
        # In bf16 the two paths round differently; the fast one must be as close to fp32 as the PyTorch one
        # (within 1.5x) or within tol of it. In fp32 the PyTorch path is the truth, so tol applies as is.
        err, slow_err = rel_err(out, truth), rel_err(ref, truth)
        assert err < max(tol, 1.5 * slow_err), (f"logits relative error {err:.2e} against fp32 at step {query_lens} "
                                                f"(PyTorch path in {dtype}: {slow_err:.2e})")
    if dtype == torch.bfloat16:  # the one-decode step took the one-row kernels (fp32 keeps the GEMM paths)
        layers = hf_config.num_hidden_layers
        assert folds.count((True, False, True)) == layers  # SiLU-and-mul and the residual add in every down_proj
        assert folds.count((False, False, True)) == layers  # the residual add in every o_proj
        # qkv and gate_up of every layer and the LM head normalize inside the GEMV when the norms are folded
        assert folds.count((False, fold, False)) == 2 * layers + 1
        assert len(folds) == 4 * layers + 1
    else:
        assert not folds
