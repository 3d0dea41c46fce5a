"""LlamaForCausalLM (and its Mistral/Qwen2 names) against HF transformers, through the paged KV cache.

Each case saves a tiny random-weight transformers model, loads it with Brigade's loader, runs three
steps through the reference attention backend (a prefill of three requests; a decode of all three
reading the cache the prefill wrote; two decodes mixed with a new prefill) with non-contiguous block
tables, and compares the logits of every scheduled token with transformers' on the whole sequence,
in fp32. The real-model case does the same on SmolLM2-135M-Instruct.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from brigade.attention.reference import ReferenceAttentionBackend
from brigade.config import ModelConfig
from brigade.model_executor.loader import get_hf_config, load_model

TINY = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

CASES = {
    "llama-gqa-tied": lambda: transformers.LlamaConfig(**TINY, tie_word_embeddings=True,
                                                       architectures=["LlamaForCausalLM"]),
    "llama-untied-biases": lambda: transformers.LlamaConfig(**TINY, tie_word_embeddings=False, attention_bias=True,
                                                            mlp_bias=True, architectures=["LlamaForCausalLM"]),
    "llama3-rope-scaling": lambda: transformers.LlamaConfig(**TINY, rope_parameters=dict(LLAMA3_ROPE),
                                                            architectures=["LlamaForCausalLM"]),
    "mistral-head-dim": lambda: transformers.MistralConfig(**TINY, head_dim=32, sliding_window=None,
                                                           architectures=["MistralForCausalLM"]),
    "qwen2-qkv-bias": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=False,
                                                       architectures=["Qwen2ForCausalLM"]),
}


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    scale = ref.abs().max().item()
    err = (ours.float() - ref.float()).abs().max().item()
    assert err <= rel * scale, f"max abs diff {err:.3g} exceeds {rel:g} x logit scale {scale:.3g}"


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([token_ids])).logits[0]  # [L, vocab]


def load_with_transformers(path: Path) -> tuple[transformers.PretrainedConfig, torch.nn.Module, torch.nn.Module]:
    """The checkpoint at ``path`` loaded twice in fp32 on the CPU: (its HF config, Brigade's model on the
    reference attention backend, transformers' model in eval mode)."""
    hf_config = get_hf_config(str(path))
    model = load_model(ModelConfig(model=str(path)), hf_config, dtype=torch.float32, device=torch.device("cpu"),
                       attn_backend=ReferenceAttentionBackend)
    return hf_config, model, transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def run_three_steps(model, hf_model, steps, vocab_size: int, seed: int = 0) -> None:
    """Prefill a, b, c; decode a, b, c; decode a, b while prefilling d. Check every step's logits."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab_size, (n,), generator=gen).tolist()

    seqs = {"a": tokens(5), "b": tokens(19), "c": tokens(3), "d": tokens(6)}
    for req_id, blocks in {"a": [9, 2, 17], "b": [4, 30, 11, 0, 23, 6], "c": [15], "d": [28, 3]}.items():
        steps.add_request(req_id, blocks)
    schedule = [
        [("a", seqs["a"]), ("b", seqs["b"]), ("c", seqs["c"])],
        [("a", tokens(1)), ("b", tokens(1)), ("c", tokens(1))],
        [("a", tokens(1)), ("b", tokens(1)), ("d", seqs["d"])],
    ]
    for scheduled in schedule:
        for req_id, new in scheduled:
            if steps.num_computed[req_id] > 0:  # a decode extends the sequence transformers sees
                seqs[req_id] = seqs[req_id] + new
        input_ids, positions, ctx = steps.step(scheduled)
        with torch.inference_mode():
            logits = model.compute_logits(model(input_ids, positions, ctx))  # [T, vocab]
        start = 0
        for req_id, new in scheduled:
            full = seqs[req_id]
            ref = hf_logits(hf_model, full)[len(full) - len(new):]
            assert_logits_close(logits[start:start + len(new)], ref)
            start += len(new)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_through_paged_cache(case, tmp_path, paged_steps_for, save_random_hf_model):
    path = save_random_hf_model(tmp_path / case, CASES[case]())
    hf_config, model, hf_model = load_with_transformers(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.lm_head.tied == bool(hf_config.tie_word_embeddings)
    run_three_steps(model, hf_model, paged_steps_for(hf_config), hf_config.vocab_size)


def test_bf16_model_tracks_fp32(tmp_path, paged_steps_for, save_random_hf_model):
    path = save_random_hf_model(tmp_path / "m", CASES["llama-gqa-tied"]())
    hf_config = get_hf_config(str(path))
    outs = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_model(ModelConfig(model=str(path)), hf_config, dtype=dtype, device=torch.device("cpu"),
                           attn_backend=ReferenceAttentionBackend)
        assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == dtype
        steps = paged_steps_for(hf_config, dtype)
        steps.add_request("a", [5, 1, 3])
        input_ids, positions, ctx = steps.step([("a", list(range(10, 21)))])
        with torch.inference_mode():
            outs[dtype] = model.compute_logits(model(input_ids, positions, ctx))
    assert outs[torch.bfloat16].dtype == torch.bfloat16
    assert_logits_close(outs[torch.bfloat16], outs[torch.float32], rel=3e-2)


def test_real_smollm2_matches_transformers(smollm2_path, hf_reference, paged_steps_for):
    hf_config = get_hf_config(str(smollm2_path))
    model = load_model(ModelConfig(model=str(smollm2_path)), hf_config, dtype=torch.float32,
                       device=torch.device("cpu"), attn_backend=ReferenceAttentionBackend)
    tok = hf_reference.tokenizer
    prompts = [tok.encode("The capital of France is"), tok.encode("def fibonacci(n):"), tok.encode("Hello, my name is")]
    steps = paged_steps_for(hf_config)
    for i, blocks in enumerate([[7, 1, 12], [3, 20, 9], [25, 14]]):
        steps.add_request(str(i), blocks)
    input_ids, positions, ctx = steps.step([(str(i), p) for i, p in enumerate(prompts)])
    with torch.inference_mode():
        prefill = model.compute_logits(model(input_ids, positions, ctx))
    last = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    next_ids = prefill[last].argmax(-1).tolist()
    input_ids, positions, ctx = steps.step([(str(i), [t]) for i, t in enumerate(next_ids)])
    with torch.inference_mode():
        decode = model.compute_logits(model(input_ids, positions, ctx))
    for i, prompt in enumerate(prompts):
        ref = hf_logits(hf_reference.model, prompt + [next_ids[i]])
        assert_logits_close(prefill[last[i]], ref[-2])
        assert_logits_close(decode[i], ref[-1])
    # transformers' greedy continuation on these weights: " Paris".
    assert tok.decode([next_ids[0]]) == " Paris"


@pytest.fixture
def cpu_fused_gemms():
    """Registers plain-PyTorch versions of the fused GEMM variants as the "cpu" platform's kernels in the real
    kernel registry and records which ran; removes them afterwards."""
    import torch.nn.functional as F

    from brigade.model_executor.layers.activation import SiluAndMul
    from brigade.plugins.kernels import registered_kernel

    calls: list[str] = []

    def rms_norm_gemm(x, weight, bias, eps):
        calls.append("rms_norm")
        xf = x.float()
        return F.linear((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype), weight, bias)

    def residual_gemm(x, weight, bias, residual):
        calls.append("residual")
        return residual + F.linear(x, weight, bias)

    def silu_mul_gemm(x, weight, bias, *, residual=None):
        calls.append("silu_mul")
        out = F.linear(SiluAndMul().forward_native(x), weight, bias)
        return out if residual is None else residual + out

    with registered_kernel("dense_gemm", "cpu", F.linear), registered_kernel("silu_mul_gemm", "cpu", silu_mul_gemm), \
            registered_kernel("residual_gemm", "cpu", residual_gemm), \
            registered_kernel("rms_norm_gemm", "cpu", rms_norm_gemm):
        yield calls


@pytest.mark.parametrize("case", ["llama-gqa-tied", "llama-untied-biases"])
def test_folded_norms_match_transformers(case, tmp_path, paged_steps_for, save_random_hf_model, cpu_fused_gemms):
    """Where the platform registers an RMS-norm GEMM, the loader folds every norm weight into the projection that
    reads it (not into a head tied to the embedding); the model then normalizes inside the GEMMs, adds each
    residual in its branch's last GEMM, and still gives transformers' logits."""
    path = save_random_hf_model(tmp_path / case, CASES[case]())
    hf_config, model, hf_model = load_with_transformers(path)
    tied = bool(hf_config.tie_word_embeddings)
    norms = [m for layer in model.model.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]
    assert all(n.weight_folded and bool((n.weight == 1).all()) for n in norms)
    assert model.model.norm.weight_folded is not tied
    hf_norm = hf_model.model.layers[0].input_layernorm.weight.detach()
    assert not torch.allclose(hf_norm, torch.ones_like(hf_norm))  # the fold had something to move
    run_three_steps(model, hf_model, paged_steps_for(hf_config), hf_config.vocab_size)
    per_step = 2 * hf_config.num_hidden_layers  # qkv and gate_up normalize; o_proj adds; down does both
    assert cpu_fused_gemms.count("rms_norm") == 3 * (per_step + (0 if tied else 1))
    assert cpu_fused_gemms.count("residual") == cpu_fused_gemms.count("silu_mul") == 3 * hf_config.num_hidden_layers
