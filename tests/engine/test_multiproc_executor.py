"""The mp executor: the worker runs in its own process, started by fork or by spawn, loads the general and
platform plugins there, and produces transformers' greedy tokens while the EngineCore overlaps steps."""

from __future__ import annotations

import os

import pytest

from brigade import LLM, SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_process_sees_plugins_and_matches_transformers(method, monkeypatch, smollm2_path, hf_reference):
    monkeypatch.setenv("BRIGADE_WORKER_MULTIPROC_METHOD", method)
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=256, distributed_executor_backend="mp",
              async_scheduling=True)
    try:
        executor = llm.engine.core.executor
        (info,) = executor.worker_info
        assert info.pid != os.getpid() and info.start_method == method
        assert info.platform == "cpu" and info.attention_backend == "reference"
        # The core's own plugin (general group) loads in the worker, and so do the installed platform
        # plugins, whose detectors find no hardware here.
        assert info.plugins["builtin"] == "loaded", info.plugins
        assert all(info.plugins[name] == "not_detected" for name in ("cuda", "rocm", "oot")), info.plugins
        tokenizer = llm.get_tokenizer()
        prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
        outputs = llm.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == hf_reference.greedy(prompt_ids, 16)
        stats = llm.get_kv_cache_stats()
        assert stats["num_free_blocks"] == stats["num_total_blocks"]
    finally:
        llm.engine.core.shutdown()
    assert not any(p.is_alive() for p in executor.procs)


def test_tensor_parallel_above_one_is_refused_clearly(smollm2_path):
    with pytest.raises(ValueError, match="not implemented yet"):
        LLM(str(smollm2_path), dtype="float32", max_model_len=256, tensor_parallel_size=2)
