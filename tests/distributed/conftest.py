"""The tiny random-weight Llama the parallelism tests serve, with transformers' greedy tokens on ``PROMPTS``."""

from __future__ import annotations

import pytest
import torch
import transformers
from parallel_check import MAX_TOKENS, PROMPTS


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """4 query heads, 1 KV head (replicated under -tp 2), untied LM head, a vocabulary that -tp 2 pads."""
    config = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny-llama-kv1")
    model.save_pretrained(path)
    refs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 do_sample=False)
            refs.append(out[0, len(prompt):].tolist())
    return path, refs, sum(p.numel() * 4 for p in model.parameters())
