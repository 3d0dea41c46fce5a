"""``LLM(model, data_parallel_size=2)``: two EngineCore processes, each with its own scheduler and KV cache, behind the
offline front end; each prompt goes to the least-loaded engine. Greedy outputs equal one engine's, both engines take
requests, the children of an ``n > 1`` request share one engine, a killed engine fails ``generate`` naming it, and
no process is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from brigade import LLM, SamplingParams
from brigade.engine.core_client import EngineDeadError

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "Once upon a time, a fox"]
ARGS = {"max_model_len": 256, "num_gpu_blocks_override": 32}


def test_two_engines_give_the_outputs_of_one_then_fail_together(smollm2_path):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    one = LLM(smollm2_path, **ARGS)
    expected = [o.outputs[0].token_ids for o in one.generate(PROMPTS, params, use_tqdm=False)]
    del one
    two = LLM(smollm2_path, data_parallel_size=2, **ARGS)
    client = two.engine.core
    pids = [proc.pid for proc in client.engines.procs]
    try:
        assert [o.outputs[0].token_ids for o in two.generate(PROMPTS, params, use_tqdm=False)] == expected
        # Each engine's own count of the requests it took (sent with its outputs): two each.
        assert client.balancer.num_received == [2, 2]
        assert two.get_kv_cache_stats() == {"num_free_blocks": 62, "num_total_blocks": 62}  # two pools of 31, all free
        # n = 2: both sequences on one engine (three on one, one on the other would be 2 + 2 + 2 otherwise).
        out = two.generate(PROMPTS[0], SamplingParams(n=2, temperature=0, max_tokens=4), use_tqdm=False)[0]
        assert [c.token_ids for c in out.outputs] == [expected[0][:4]] * 2
        assert sorted(client.balancer.num_received) == [2, 4]
        # Engine 1 killed while both run: generate fails, naming it; the other engine is stopped too.
        killer = threading.Timer(1.0, os.kill, (pids[1], signal.SIGKILL))
        killer.start()
        with pytest.raises(EngineDeadError, match=r"DP engine 1: engine process exited with code -9"):
            two.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), use_tqdm=False)
        killer.join()
    finally:
        two.shutdown()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, "an engine process outlived shutdown()"
        time.sleep(0.1)
