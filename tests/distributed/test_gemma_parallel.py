"""Gemma 2 (sandwich norms, GeGLU, scaled and tied embedding, soft-capped scores and logits, sliding-window layers
alternating with global ones) under ``-tp 2`` (2 KV heads, one per rank) and ``-pp 2`` (one layer per stage, the
last holding the embedding for its tied head) on the mp executor with real gloo groups: the same greedy tokens as
transformers' ``Gemma2ForCausalLM`` (fp32) with prompts past the 8-token window, chunked prefill, preemption and
prefix caching."""

from __future__ import annotations

import transformers
from parallel_check import run_check, save_with_greedy_references


def test_gemma2_tp2_and_pp2_match_transformers(tmp_path):
    config = transformers.Gemma2Config(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=256, sliding_window=8, query_pre_attn_scalar=24,
                                       attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                       bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                       architectures=["Gemma2ForCausalLM"])
    assert config.layer_types == ["sliding_attention", "full_attention"]
    refs, _ = save_with_greedy_references(config, tmp_path, transformers.Gemma2ForCausalLM)
    # Two KV cache groups of one layer each: a block id is one layer's page, so 12 ids are the memory of the check's
    # default 6 blocks of two layers; still few enough that requests are preempted.
    got = run_check(tmp_path, "fork", "auto", "1x1,2x1,1x2", num_gpu_blocks_override=12)
    for layout in ("1x1", "2x1", "1x2"):
        assert got[layout]["tokens"] == refs, layout
        assert got[layout]["again"] == refs[2:], layout
        assert got[layout]["preemptions"] > 0, layout
        assert got[layout]["kv"]["num_free_blocks"] == got[layout]["kv"]["num_total_blocks"], layout
