"""A client that drops a completions request of thousands of prompts does not freeze the API server: each
sequence's abort costs O(1), so /health keeps answering within a second while they are aborted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from remote_server import RemoteServer

from brigade.entrypoints.openai.serving_completion import MAX_SEQUENCES_PER_REQUEST

NUM_PROMPTS = 8000  # quadratic aborts froze the server ~2.5 s at this size; linear ones cost milliseconds


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--max-model-len", "256", "--disable-log-requests"])
    yield srv
    srv.stop()


def test_one_request_may_not_start_more_than_the_sequence_cap(server):
    model = httpx.get(server.url("/v1/models")).json()["data"][0]["id"]
    num_prompts = MAX_SEQUENCES_PER_REQUEST // 2 + 1
    response = httpx.post(server.url("/v1/completions"), timeout=60,
                          json={"model": model, "prompt": [[1]] * num_prompts, "n": 2, "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt" and f"at most {MAX_SEQUENCES_PER_REQUEST}" in error["message"]
    assert httpx.get(server.url("/health")).status_code == 200
    docs = (Path(__file__).resolve().parents[3] / "docs" / "server.md").read_text()
    assert f"at most {MAX_SEQUENCES_PER_REQUEST:,} sequences" in docs, "the limit is documented"


def test_health_answers_while_thousands_of_prompts_are_aborted(server):
    model = httpx.get(server.url("/v1/models")).json()["data"][0]["id"]
    body = {"model": model, "prompt": [[1, 2, 3 + i % 100] for i in range(NUM_PROMPTS)], "max_tokens": 64,
            "ignore_eos": True}
    dropped = threading.Event()

    def post_and_drop() -> None:
        try:
            httpx.post(server.url("/v1/completions"), json=body, timeout=3.0)
        except httpx.TimeoutException:
            pass
        dropped.set()

    threading.Thread(target=post_and_drop, daemon=True).start()
    assert dropped.wait(60)
    latencies = []
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline:
        start = time.monotonic()
        assert httpx.get(server.url("/health"), timeout=30).status_code == 200
        latencies.append(time.monotonic() - start)
        time.sleep(0.05)
    assert max(latencies) < 1.0, f"/health took up to {max(latencies):.2f} s while the request was aborted"
    # every sequence was aborted: the engine ends up with nothing running or waiting
    deadline = time.monotonic() + 60
    while True:
        lines = [line for line in httpx.get(server.url("/metrics")).text.splitlines()
                 if line.startswith(("brigade:num_requests_running", "brigade:num_requests_waiting"))]
        if len(lines) == 2 and all(float(line.split()[-1]) == 0 for line in lines):
            break
        assert time.monotonic() < deadline, lines
        time.sleep(0.5)
