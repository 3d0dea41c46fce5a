"""Qwen3 dense (``Qwen3ForCausalLM``: q_norm/k_norm on each head, head_dim 32 with 4 heads over a hidden size of
64) under ``-tp 2`` (2 KV heads, one per rank) and ``-pp 2`` (one layer per stage) on the mp executor with real gloo
groups: the same greedy tokens as transformers' ``Qwen3ForCausalLM`` (fp32), with chunked prefill, preemption and
prefix caching."""

from __future__ import annotations

import transformers
from parallel_check import run_check, save_with_greedy_references


def test_qwen3_tp2_and_pp2_match_transformers(tmp_path):
    config = transformers.Qwen3Config(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                      architectures=["Qwen3ForCausalLM"])
    refs, _ = save_with_greedy_references(config, tmp_path, transformers.Qwen3ForCausalLM)
    got = run_check(tmp_path, "fork", "auto", "1x1,2x1,1x2")
    for layout in ("1x1", "2x1", "1x2"):
        assert got[layout]["tokens"] == refs, layout
        assert got[layout]["again"] == refs[2:], layout
        assert got[layout]["preemptions"] > 0, layout
