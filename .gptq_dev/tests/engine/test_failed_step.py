"""A step that fails inside the model leaves the scheduler and the model runner out of step, so the offline
engine reports the failure as EngineDeadError, naming the first error, on that call and every later one,
instead of failing later in unrelated ways (as a float seed once did with a KeyError)."""

from __future__ import annotations

import pytest

from brigade import LLM, SamplingParams
from brigade.engine.core_client import EngineDeadError


def test_a_failed_step_makes_the_engine_refuse_work_with_the_first_error(smollm2_path, monkeypatch):
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=256)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    assert len(llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].outputs[0].token_ids) == 3
    runner = llm.engine.core.executor.worker.model_runner

    def broken(*args, **kwargs):  # fault injection: the model raises mid-step
        raise RuntimeError("injected device fault")

    monkeypatch.setattr(runner, "_forward", broken)
    with pytest.raises(EngineDeadError, match="injected device fault"):
        llm.generate([[4, 5, 6]], params, use_tqdm=False)
    monkeypatch.undo()
    with pytest.raises(EngineDeadError, match="injected device fault"):
        llm.generate([[1, 2, 3]], params, use_tqdm=False)
