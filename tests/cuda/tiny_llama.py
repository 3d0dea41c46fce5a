"""The small random-weight Llama of the engine-level GPU tests (no CUDA needed to import)."""

from __future__ import annotations


def tiny_llama_config(initializer_range: float = 0.1):
    """The small random-weight Llama of the engine-level GPU tests (4 layers, hidden 256, GQA 4/2 heads, vocab 512,
    no EOS), built by transformers; ``initializer_range`` sets how strongly attention mixes the context."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024,
                       initializer_range=initializer_range, rms_norm_eps=1e-5, rope_theta=10000.0, eos_token_id=None,
                       bos_token_id=None, tie_word_embeddings=False)


def cuda_greedy_reference(ref_dir, max_new_tokens: int = 24) -> tuple[list[list[int]], list[list[int]]]:
    """Three seeded random prompts (5, 33 and 90 tokens, vocab 512) and transformers' greedy continuations of
    ``max_new_tokens`` tokens each from the checkpoint at ``ref_dir``, in fp32 on CUDA: (prompts, expected)."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).cuda().eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 33, 90)]
    expected = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            out = ref.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                               pad_token_id=0, attention_mask=torch.ones_like(ids))
            expected.append(out[0, len(p):].tolist())
    del ref
    torch.cuda.empty_cache()
    return prompts, expected


def assert_quantized_engine_matches(path: str, prompts: list[list[int]], expected: list[list[int]], gemm,
                                    eager: bool) -> None:
    """Brigade on CUDA in fp32 (CUDA graphs, or ``eager``) on the quantized checkpoint at ``path``: its layers bind
    ``gemm`` (the plugin's Triton kernel), and its greedy tokens equal ``expected`` (batched, then one prompt alone).

    Raises:
        AssertionError: the kernel is not bound, or a token differs.
    """
    import torch

    from brigade import LLM, SamplingParams

    llm = LLM(path, dtype="float32", skip_tokenizer_init=True, kv_cache_memory_gib=2, max_model_len=512,
              enforce_eager=eager)
    model = llm.engine.core.executor.worker.model_runner.model
    assert model.model.layers[0].mlp.down_proj.quant_method.gemm is gemm
    params = SamplingParams(temperature=0.0, max_tokens=len(expected[0]), ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[:1], params, use_tqdm=False)] == expected[:1]
    del llm, model
    torch.cuda.empty_cache()
