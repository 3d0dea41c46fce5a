"""``brigade serve -dp 2``: two EngineCore processes, each with its own scheduler and KV cache, behind one API server
that sends each request to the least-loaded engine. Both engines serve, greedy outputs equal one engine's (the
offline LLM's, -dp 1), per-engine series carry the ``engine`` label, aborts reach the engine that owns the request,
and killing one engine fails every request in flight and stops the server with one line naming it, leaving no
process behind."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from remote_server import RemoteServer

from brigade import LLM, SamplingParams

MODEL = "smollm2"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "Once upon a time, a fox"]
MAX_TOKENS = 8
ENGINE_ARGS = ["--served-model-name", MODEL, "-dp", "2", "--max-model-len", "256", "--num-gpu-blocks-override", "32",
               "--disable-log-requests"]
PIDS = re.compile(r"engine (\d) \(pid (\d+)\)")


@pytest.fixture(scope="module")
def server(smollm2_path):
    server = RemoteServer(smollm2_path, ENGINE_ARGS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def one_engine_texts(smollm2_path) -> list[str]:
    """The same prompts, greedy, on one engine (the offline LLM, -dp 1)."""
    llm = LLM(smollm2_path, max_model_len=256, num_gpu_blocks_override=32)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                           use_tqdm=False)
    return [o.outputs[0].text for o in outputs]


def engine_series(server, name: str) -> dict[str, float]:
    """{engine index: value} of one per-engine series in /metrics."""
    pattern = re.compile(rf'^{re.escape(name)}\{{engine="(\d+)",model_name="{MODEL}"\}} (\S+)$', re.M)
    return {engine: float(value) for engine, value in pattern.findall(httpx.get(server.url("/metrics")).text)}


def wait_idle(server, timeout_s: float) -> None:
    """Until no engine runs or holds a request and every KV block of each is free."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = engine_series(server, "brigade:num_requests_running")
        usage = engine_series(server, "brigade:kv_cache_usage_perc")
        if set(running.values()) == {0.0} and set(usage.values()) == {0.0}:
            return
        assert time.monotonic() < deadline, (running, usage)
        time.sleep(0.1)


def test_both_engines_serve_and_outputs_equal_one_engine(server, one_engine_texts):
    client = server.openai_client()
    log = server.log_tail(100_000)
    # each engine's share of the cores, or the OMP_NUM_THREADS the operator set (the test runner sets 1)
    assert re.search(r"dp=2 tp=1 pp=1: engine 0 \(pid \d+\) on the cpu, (\d+ threads?|OMP_NUM_THREADS=\d+); "
                     r"engine 1 \(pid \d+\) on the cpu", log), log[-2000:]

    def complete(prompt: str) -> str:
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body={"ignore_eos": True})
        return out.choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # a burst: spread before any engine reports
        texts = list(pool.map(complete, PROMPTS))
    assert texts == one_engine_texts
    assert [complete(p) for p in PROMPTS] == one_engine_texts  # one at a time: the engines alternate
    queries = engine_series(server, "brigade:prefix_cache_queries_total")
    assert set(queries) == {"0", "1"} and all(v > 0 for v in queries.values()), queries  # both looked prompts up
    total = engine_series(server, "brigade:num_total_blocks")
    assert total == {"0": 31.0, "1": 31.0}  # each engine its own pool (block 0 is the null block)
    wait_idle(server, 30)


def test_an_abort_reaches_the_engine_that_owns_the_request(server):
    """A stream closed after two chunks is aborted in its engine at once; if the abort went to the other engine the
    request would run on for 240 tokens (about ten seconds on the CPU)."""
    client = server.openai_client()
    for _ in range(2):  # the two streams land on different engines (ties rotate)
        stream = client.completions.create(model=MODEL, prompt="Count to a thousand:", max_tokens=240, stream=True,
                                           extra_body={"ignore_eos": True})
        for _, _ in zip(stream, range(2)):
            pass
        stream.close()
    wait_idle(server, 5)


def test_killing_one_engine_fails_all_requests_and_stops_the_server(server):
    """Ends the module's server, so it stays the last test of this file (tests run in file order)."""
    pids = {int(index): int(pid) for index, pid in PIDS.findall(server.log_tail(100_000))}
    assert set(pids) == {0, 1}
    client = server.openai_client()
    started = [threading.Event(), threading.Event()]
    errors: list[BaseException | None] = [None, None]

    def stream(i: int) -> None:
        try:
            for _ in client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=240, stream=True,
                                               extra_body={"ignore_eos": True}):
                started[i].set()
        except BaseException as exc:  # the error event in the stream
            errors[i] = exc

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    assert all(event.wait(60) for event in started)
    # One stream on each engine: the per-engine gauge says so.
    deadline = time.monotonic() + 10
    while engine_series(server, "brigade:num_requests_running") != {"0": 1.0, "1": 1.0}:
        assert time.monotonic() < deadline, engine_series(server, "brigade:num_requests_running")
        time.sleep(0.05)
    os.kill(pids[1], signal.SIGKILL)
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a stream hangs after the engine died"
    # Both streams end in an error: the one on the dead engine, and the one on the live engine.
    assert all(isinstance(e, openai.APIError) and "engine" in str(e) for e in errors), errors
    assert server.proc.wait(timeout=30) == 1, server.log_tail()
    last = server.log_tail().strip().splitlines()[-1]
    assert last == ("brigade serve: error: the engine died (DP engine 1: engine process exited with code -9); "
                    "the server shut down"), last
    assert "Traceback" not in server.log_tail(100_000)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pids[0]}").exists():  # the live engine stopped (and was reaped) too
        assert time.monotonic() < deadline, f"engine 0 (pid {pids[0]}) is still there"
        time.sleep(0.1)
