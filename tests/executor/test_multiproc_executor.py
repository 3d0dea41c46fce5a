"""The mp executor: the worker runs in its own process, started by fork or by spawn, loads the general and
platform plugins there, and produces transformers' greedy tokens while the EngineCore overlaps steps.

Each check runs in a fresh interpreter: forking from pytest's own process, which earlier tests have filled
with threads and locks, could deadlock the child (the standing hazard of fork in threaded programs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]

_CHECK = r"""
import json, os, sys
from brigade import LLM, SamplingParams
model, prompts = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(model, dtype="float32", max_model_len=256, distributed_executor_backend="mp", async_scheduling=True)
executor = llm.engine.core.executor
(info,) = executor.worker_info
tok = llm.get_tokenizer()
ids = [tok.encode(p) for p in prompts]
outs = llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
stats = llm.get_kv_cache_stats()
llm.engine.core.shutdown()
print(json.dumps({"parent_pid": os.getpid(), "worker_pid": info.pid, "start_method": info.start_method,
                  "platform": info.platform, "backend": info.attention_backend, "plugins": info.plugins,
                  "prompt_ids": ids, "tokens": [o.outputs[0].token_ids for o in outs], "kv": stats,
                  "alive": [p.is_alive() for p in executor.procs]}))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_process_sees_plugins_and_matches_transformers(method, smollm2_path, hf_reference):
    env = {**os.environ, "BRIGADE_WORKER_MULTIPROC_METHOD": method}
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(smollm2_path), json.dumps(PROMPTS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["worker_pid"] != got["parent_pid"] and got["start_method"] == method
    assert got["platform"] == "cpu" and got["backend"] == "cpu"
    # The core's own plugin (general group) loads in the worker, and so do the installed platform plugins,
    # whose detectors find no hardware here.
    assert got["plugins"]["builtin"] == "loaded", got["plugins"]
    assert all(got["plugins"][name] == "not_detected" for name in ("cuda", "rocm", "oot")), got["plugins"]
    assert got["tokens"] == hf_reference.greedy(got["prompt_ids"], 16)
    assert got["kv"]["num_free_blocks"] == got["kv"]["num_total_blocks"]
    assert not any(got["alive"]), "workers must exit on shutdown"
