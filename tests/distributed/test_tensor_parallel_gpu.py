"""``-tp 2`` on two GPUs (NCCL): transformers' greedy tokens (fp32) with CUDA graphs captured around the
collectives and overlapped scheduling on, and ``-tp 2 -pp 2`` on four. Runs where CUDA shows enough devices."""

from __future__ import annotations

import pytest
import torch
import transformers
from parallel_check import run_check, save_with_greedy_references

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def gpu_llama(tmp_path_factory):
    """64-wide heads (what the Triton backend takes), 4 query heads and 1 KV head: replicated under -tp 2."""
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    path = tmp_path_factory.mktemp("gpu-llama-kv1")
    return path, save_with_greedy_references(config, path)[0]


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")
def test_tp2_on_two_gpus_with_cuda_graphs_matches_transformers(gpu_llama):
    path, refs = gpu_llama
    got = run_check(path, "spawn", "auto", "2x1", block_size=16, max_model_len=64, num_gpu_blocks_override=32,
                    max_num_batched_tokens=64)["2x1"]
    assert got["tokens"] == refs and got["again"] == refs[2:]
    assert got["kv"]["num_free_blocks"] == got["kv"]["num_total_blocks"]
    assert [p.split(":")[0] for p in got["places"]] == ["rank 0/2 (local rank 0, device cuda:0)",
                                                        "rank 1/2 (local rank 1, device cuda:1)"]


@pytest.mark.skipif(GPUS < 4, reason="needs four CUDA devices")
def test_tp2_pp2_on_four_gpus_matches_transformers(gpu_llama):
    path, refs = gpu_llama
    got = run_check(path, "spawn", "auto", "2x2", block_size=16, max_model_len=64, num_gpu_blocks_override=32,
                    max_num_batched_tokens=64)["2x2"]
    assert got["tokens"] == refs and got["peak_in_flight"] == 2


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")
def test_moe_tp2_and_expert_parallel_on_two_gpus_match_transformers(tmp_path):
    """Mixtral with 8 experts on two GPUs, sliced (-tp 2) and spread (+ep), through brigade-cuda's fused MoE
    kernel under CUDA graphs with the NCCL all-reduce of each MoE layer captured."""
    from moe_checkpoints import greedy_reference, moe_config, save_moe_checkpoint
    from parallel_check import MAX_TOKENS, PROMPTS

    config = moe_config("mixtral", vocab_size=300, hidden_size=256, intermediate_size=128, num_local_experts=8)
    refs = greedy_reference(save_moe_checkpoint(config, tmp_path), PROMPTS, MAX_TOKENS)
    got = run_check(tmp_path, "spawn", "auto", "2x1,2x1+ep", block_size=16, max_model_len=64,
                    num_gpu_blocks_override=32, max_num_batched_tokens=64)
    for layout in ("2x1", "2x1+ep"):
        assert got[layout]["tokens"] == refs and got[layout]["again"] == refs[2:], layout
        assert got[layout]["expert_param_bytes"][0] == got[layout]["expert_param_bytes"][1], layout
