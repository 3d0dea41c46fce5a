"""Pipeline parallelism on the mp executor, with real gloo process groups: ``-pp 2`` and ``-tp 2 -pp 2`` on a tiny
random-weight Llama give transformers' greedy tokens (fp32) with chunked prefill, preemption and prefix caching;
each stage holds its own layers only, the last one samples, and the engine keeps two batches in flight (one per
stage)."""

from __future__ import annotations

from parallel_check import run_check

from brigade.distributed.sharding import pp_layer_range


def test_layers_split_as_vllm_splits_them():
    assert [pp_layer_range(2, r, 2) for r in range(2)] == [(0, 1), (1, 2)]
    # the remainder goes to the stages before the last, from the second-to-last backwards
    assert [pp_layer_range(10, r, 4) for r in range(4)] == [(0, 2), (2, 5), (5, 8), (8, 10)]
    assert [pp_layer_range(30, r, 3) for r in range(3)] == [(0, 10), (10, 20), (20, 30)]


def test_pp2_and_tp2_pp2_greedy_tokens_match_transformers(tiny_llama):
    path, refs, model_bytes = tiny_llama
    got = run_check(path, "fork", "auto", "1x2,2x2")
    for layout, world in (("1x2", 2), ("2x2", 4)):
        seen = got[layout]
        assert seen["tokens"] == refs, layout
        assert seen["again"] == refs[2:], layout
        assert seen["preemptions"] > 0, layout
        assert seen["peak_in_flight"] == 2, layout  # the batch queue kept both stages busy
        assert seen["kv"]["num_free_blocks"] == seen["kv"]["num_total_blocks"], layout
        assert len(seen["pids"]) == world and not any(seen["alive"])
    # the 2x2 grid: TP fastest, so ranks 0, 1 are stage 0 and ranks 2, 3 stage 1
    places = got["2x2"]["places"]
    assert ["pp 0/2, tp 0/2" in places[0], "pp 0/2, tp 1/2" in places[1], "pp 1/2, tp 0/2" in places[2],
            "pp 1/2, tp 1/2" in places[3]] == [True] * 4, places
    # Each stage holds its own decoder layer; the first the embedding, the last the LM head.
    stage_bytes = got["1x2"]["param_bytes"]
    assert all(held < 0.75 * model_bytes for held in stage_bytes) and sum(stage_bytes) >= model_bytes * 0.95


def test_the_kv_pool_is_sized_by_the_tightest_stage(tmp_path):
    """3 layers over 2 stages: stage 0 holds 2 (2 KiB of KV per 8-token block), stage 1 holds 1 (1 KiB). Given
    1 MiB of KV cache per rank, stage 0 fits 512 blocks and stage 1 1024: the one pool the scheduler sees is 512
    blocks (less the null block), so no block id can overflow stage 0's cache; the tokens stay transformers'."""
    import transformers
    from parallel_check import save_with_greedy_references

    config = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    refs, _ = save_with_greedy_references(config, tmp_path)
    got = run_check(tmp_path, "fork", "auto", "1x1,1x2", num_gpu_blocks_override=None, kv_cache_memory_gib=2**-10)
    assert got["1x1"]["kv"]["num_total_blocks"] == 1024 // 3 - 1  # one rank, 3 KiB a block
    assert got["1x2"]["kv"]["num_total_blocks"] == 512 - 1, got["1x2"]["kv"]
    assert got["1x2"]["tokens"] == got["1x1"]["tokens"] == refs
