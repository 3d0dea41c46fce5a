"""Experts spread over data-parallel engines: ``LLM(..., data_parallel_size=2, enable_expert_parallel=True)`` on a
tiny random-weight Qwen3-MoE (8 experts, top-3). Two EngineCore processes, each one rank of one gloo world, hold 4
experts each; every MoE layer gathers both engines' tokens and scatters the sums back. Greedy tokens equal
transformers' (fp32) with both engines busy (unequal batches, so the dispatch pads), and with one engine idle while
the other runs (the idle one must run dummy forward passes, or the busy one's collectives would stall until the
distributed timeout); every KV block is back in both pools; a killed engine fails ``generate`` instead of hanging.
With ``-tp 2`` as well (four mp workers in one world, Mixtral's 4 experts one per rank), the same tokens. On two
GPUs (NCCL device groups, brigade-cuda's fused MoE kernel, eager), the same checks where CUDA shows two devices."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from moe_checkpoints import greedy_reference, moe_config, save_moe_checkpoint
from parallel_check import MAX_TOKENS, PROMPTS

from brigade import LLM, SamplingParams
from brigade.engine.core_client import EngineDeadError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _greedy(llm, prompts) -> list[list[int]]:
    """Each token-id prompt's greedy tokens, as the offline LLM generates them."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_two_engines_share_the_experts_and_match_transformers(tmp_path, monkeypatch, capfd):
    # A collective that stalls (an engine that skipped its dummy step) fails the test in 60 s, not 600.
    monkeypatch.setenv("BRIGADE_DISTRIBUTED_TIMEOUT", "60")
    model = save_moe_checkpoint(moe_config("qwen3-moe", vocab_size=256, max_position_embeddings=128), tmp_path)
    refs = greedy_reference(model, PROMPTS, MAX_TOKENS)
    llm = LLM(str(tmp_path), data_parallel_size=2, enable_expert_parallel=True, dtype="float32", max_model_len=32,
              skip_tokenizer_init=True, block_size=8, num_gpu_blocks_override=12, max_num_batched_tokens=8)
    client = llm.engine.core
    pids = [proc.pid for proc in client.engines.procs]
    log = capfd.readouterr().err
    for rank in (0, 1):  # one world of both engines; each holds half of the 288 KiB of experts
        assert f"rank {rank}/2 (local rank 0, device cpu): dp {rank}/2, pp 0/1, tp 0/1, ep {rank}/2, 144.0 KiB of " \
               "experts" in log, log
    try:
        assert _greedy(llm, PROMPTS) == refs  # both engines busy, with unequal batches (chunked prefill: 8 tokens)
        assert sorted(client.balancer.num_received) == [1, 2]
        assert _greedy(llm, PROMPTS[2:]) == refs[2:]  # one engine computes, the other runs dummy batches
        assert _greedy(llm, PROMPTS[:1]) == refs[:1]  # again, after both went idle together
        assert sorted(client.balancer.num_received) == [2, 3]
        assert llm.get_kv_cache_stats() == {"num_free_blocks": 22, "num_total_blocks": 22}  # two pools of 11
        # Engine 1 killed mid-generation: generate fails (engine 0 sees its peer gone), nothing hangs.
        killer = threading.Timer(1.0, os.kill, (pids[1], signal.SIGKILL))
        killer.start()
        longer = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"DP engine \d"):
            while time.monotonic() - started < 30:  # generate until the kill lands
                llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2] * 2], longer, use_tqdm=False)
        killer.join()
        assert time.monotonic() - started < 30
    finally:
        llm.shutdown()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, "an engine process outlived shutdown()"
        time.sleep(0.1)


def test_two_engines_of_two_tensor_parallel_ranks_each_hold_one_expert_per_rank(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("BRIGADE_DISTRIBUTED_TIMEOUT", "60")
    monkeypatch.setenv("BRIGADE_WORKER_MULTIPROC_METHOD", "fork")  # the engines are fresh processes, not pytest
    model = save_moe_checkpoint(moe_config("mixtral", vocab_size=256, max_position_embeddings=128), tmp_path)
    refs = greedy_reference(model, PROMPTS, MAX_TOKENS)
    llm = LLM(str(tmp_path), data_parallel_size=2, tensor_parallel_size=2, enable_expert_parallel=True,
              dtype="float32", max_model_len=32, skip_tokenizer_init=True, block_size=8, num_gpu_blocks_override=12,
              max_num_batched_tokens=8)
    log = capfd.readouterr().err
    for rank in range(4):  # the EP group is all four ranks: dp-major, tp fastest
        assert f"rank {rank}/4 (local rank {rank % 2}, device cpu): dp {rank // 2}/2, pp 0/1, tp {rank % 2}/2, " \
               f"ep {rank}/4, pid" in log, log
    try:
        for prompts, expected in ((PROMPTS, refs), (PROMPTS[1:2], refs[1:2])):  # both engines busy; one idle
            assert _greedy(llm, prompts) == expected
        assert llm.get_kv_cache_stats() == {"num_free_blocks": 22, "num_total_blocks": 22}
    finally:
        llm.shutdown()


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")
def test_two_engines_on_two_gpus_share_the_experts_and_match_transformers(tmp_path):
    """Mixtral with 8 experts, 4 per GPU: the dispatch's all-gather and reduce-scatter run on NCCL."""
    config = moe_config("mixtral", vocab_size=300, hidden_size=256, intermediate_size=128, num_local_experts=8)
    refs = greedy_reference(save_moe_checkpoint(config, tmp_path), PROMPTS, MAX_TOKENS)
    llm = LLM(str(tmp_path), data_parallel_size=2, enable_expert_parallel=True, dtype="float32", max_model_len=64,
              skip_tokenizer_init=True, block_size=16, num_gpu_blocks_override=32, max_num_batched_tokens=64)
    try:
        for prompts, expected in ((PROMPTS, refs), (PROMPTS[1:2], refs[1:2])):  # both engines busy; one idle
            assert _greedy(llm, prompts) == expected
        assert llm.get_kv_cache_stats() == {"num_free_blocks": 62, "num_total_blocks": 62}
    finally:
        llm.shutdown()
