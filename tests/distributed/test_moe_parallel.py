"""Mixture-of-experts models over two CPU ranks (mp executor, real gloo groups), in both layouts: ``-tp 2``, every
expert sliced on its intermediate dimension (and Qwen2-MoE's shared expert like a dense MLP), and ``-tp 2
--enable-expert-parallel``, each rank holding half of the experts whole. Both give transformers' greedy tokens
(fp32) on tiny random-weight Mixtral, Qwen2-MoE and Qwen3-MoE checkpoints, with chunked prefill, preemption and prefix
caching, and each rank holds exactly half of the experts' bytes."""

from __future__ import annotations

import pytest
from moe_checkpoints import greedy_reference, moe_config, num_experts, save_moe_checkpoint
from parallel_check import MAX_TOKENS, PROMPTS, run_check

SMALL = dict(vocab_size=256, max_position_embeddings=128)


@pytest.mark.parametrize("family", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_tp2_and_expert_parallel_greedy_tokens_match_transformers(family, tmp_path):
    config = moe_config(family, **SMALL)
    model = save_moe_checkpoint(config, tmp_path)
    refs = greedy_reference(model, PROMPTS, MAX_TOKENS)
    inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    expert_bytes = config.num_hidden_layers * num_experts(config) * 3 * inter * config.hidden_size * 4  # fp32
    got = run_check(tmp_path, "fork", "auto", "2x1,2x1+ep")
    for layout in ("2x1", "2x1+ep"):
        seen = got[layout]
        assert seen["tokens"] == refs, layout
        assert seen["again"] == refs[2:], layout
        assert seen["preemptions"] > 0, layout  # the 6-block pool cannot hold the three requests at once
        assert seen["kv"]["num_free_blocks"] == seen["kv"]["num_total_blocks"], seen["kv"]
        # Sliced (-tp 2) or spread whole (+ep), each rank holds half of every layer's experts.
        assert seen["expert_param_bytes"] == [expert_bytes // 2] * 2, (layout, seen["expert_param_bytes"])
        assert not any(seen["alive"]), "workers must exit on shutdown"
