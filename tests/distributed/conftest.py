"""The tiny random-weight Llamas the parallelism tests serve: one with transformers' greedy tokens on ``PROMPTS``,
one whose shapes the quantized formats take."""

from __future__ import annotations

import pytest
import torch
import transformers
from parallel_check import save_with_greedy_references


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """4 query heads, 1 KV head (replicated under -tp 2), untied LM head, a vocabulary that -tp 2 pads."""
    config = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    path = tmp_path_factory.mktemp("tiny-llama-kv1")
    refs, param_bytes = save_with_greedy_references(config, path)
    return path, refs, param_bytes


@pytest.fixture(scope="module")
def quant_llama(tmp_path_factory):
    """A tiny random Llama whose every projection AutoGPTQ's packer takes (in and out features multiples of 32):
    hidden 128, 4 heads of 32, 2 KV heads (one per rank under -tp 2), MLP 192 (96 per rank)."""
    config = transformers.LlamaConfig(vocab_size=200, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("quant-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path
