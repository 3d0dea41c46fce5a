"""Tensor parallelism on the mp executor, with real gloo process groups: ``-tp 2`` on a tiny random-weight Llama
whose one KV head is replicated on both ranks gives transformers' greedy tokens (fp32) with chunked prefill,
preemption and prefix caching, with workers started by fork and by spawn; each rank holds about half the
parameters; dummy weights are the same whatever the layout.
"""

from __future__ import annotations

import pytest
from parallel_check import run_check

@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_tp2_greedy_tokens_match_transformers(tiny_llama, method):
    path, refs, model_bytes = tiny_llama
    got = run_check(path, method, "auto", "2x1")["2x1"]
    assert got["tokens"] == refs
    assert got["again"] == refs[2:]
    assert got["preemptions"] > 0  # the 6-block pool cannot hold the three requests at once
    assert got["kv"]["num_free_blocks"] == got["kv"]["num_total_blocks"], got["kv"]
    assert got["methods"] == [method, method]
    # every rank loaded the plugins itself (a spawned worker imports them afresh)
    assert all(plugins.get("builtin") == "loaded" for plugins in got["plugins"]), got["plugins"]
    # each step reached both workers as one broadcast message, not one per worker
    assert got["steps"] > 10 and got["step_messages"] == got["steps"], (got["steps"], got["step_messages"])
    assert [p.split(":")[0] for p in got["places"]] == ["rank 0/2 (local rank 0, device cpu)",
                                                        "rank 1/2 (local rank 1, device cpu)"]
    assert "tp 0/2" in got["places"][0] and "tp 1/2" in got["places"][1]
    # Each rank holds half of every sharded matrix; the norms (and the replicated KV head) are whole on both.
    for held in got["param_bytes"]:
        assert 0.5 * model_bytes <= held <= 0.6 * model_bytes, (held, model_bytes)
    assert not any(got["alive"]), "workers must exit on shutdown"


def test_dummy_weights_do_not_depend_on_the_layout(tiny_llama):
    """--load-format dummy seeds each parameter by name over its whole shape, then slices: -tp 1 and -tp 2 run
    the same random model."""
    path, _, _ = tiny_llama
    got = run_check(path, "fork", "dummy", "1x1,2x1")
    assert got["1x1"]["tokens"] == got["2x1"]["tokens"]
    assert len(set(map(tuple, got["1x1"]["tokens"]))) > 1  # not a degenerate model
