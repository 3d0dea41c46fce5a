"""POST /pooling (the example IO-processor plugin, pip-installed) on a real ``brigade serve``: it returns the
plugin's response built from real greedy outputs of SmolLM2, and behaves as the completion routes do: a bad
``params`` value is a 400 in OpenAI's shape, ``--api-key`` guards the route, a client that drops a many-text
request leaves nothing running and every KV block free, and SIGTERM cuts a request still running at
``--shutdown-timeout`` with a 503, without a traceback. One server for the module; the SIGTERM test stops it, so it
comes last."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
from remote_server import RemoteServer, error_of

API_KEY = "pooling-key"
SHUTDOWN_TIMEOUT_S = 3.0
NUM_TEXTS = 48  # more than --max-num-seqs: some wait, some run, when the client drops the request
LONG_PARAMS = {"max_tokens": 200, "temperature": 0.0}


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--max-model-len", "256", "--io-processor-plugin", "structured_text",
                                      "--max-num-seqs", "8", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
                                      "--disable-log-requests"], api_key=API_KEY)
    yield srv
    srv.stop()


def pooling(server: RemoteServer, body: dict, *, timeout: float = 120, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(server.url("/pooling"), json=body, headers=headers, timeout=timeout)


def long_body() -> dict:
    return {"data": {"texts": [f"Write a long story about the number {i}." for i in range(NUM_TEXTS)]},
            "params": LONG_PARAMS}


def gauges(server: RemoteServer) -> dict[str, float]:
    names = ("brigade:num_requests_running", "brigade:num_requests_waiting", "brigade:kv_cache_usage_perc")
    lines = httpx.get(server.url("/metrics"), timeout=30).text.splitlines()
    return {line.split("{")[0]: float(line.split()[-1]) for line in lines if line.startswith(names)}


def test_pooling_route_runs_the_selected_io_processor(server):
    body = {"data": {"texts": ["The capital of France is", "Water boils at"]},
            "params": {"max_tokens": 8, "temperature": 0.0}}
    response = pooling(server, body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert [item["input"] for item in result["data"]] == body["data"]["texts"]
    first = result["data"][0]
    assert first["completion"].startswith(" Paris."), first
    assert first["sentences"][0] == "Paris."
    assert first["num_completion_tokens"] == 8 and first["finish_reason"] == "length"
    bad = pooling(server, {"data": {"text": ""}}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "data"


def test_a_bad_params_value_is_a_400_naming_it(server):
    error = error_of(pooling(server, {"data": {"text": "Hello"}, "params": {"max_tokens": [1]}}), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == "params.max_tokens", error
    assert "max_tokens must be an integer, got [1]" in error["message"]
    error = error_of(pooling(server, {"data": {"text": "Hello"}, "params": {"max_tokens": 10_000}}), 400)
    assert error["param"] == "params.max_tokens" and "maximum context length is 256" in error["message"], error


def test_the_api_key_guards_the_route(server):
    body = {"data": {"text": "The capital of France is"}, "params": {"max_tokens": 2, "temperature": 0.0}}
    error = error_of(pooling(server, body, key=None), 401)
    assert error["type"] == "invalid_request_error"
    error_of(pooling(server, body, key="wrong"), 401)
    response = pooling(server, body)
    assert response.status_code == 200, response.text
    assert response.json()["data"][0]["completion"].startswith(" Paris")


def test_a_dropped_request_leaves_nothing_running_and_frees_its_kv_blocks(server):
    try:
        pooling(server, long_body(), timeout=3.0)
        pytest.fail("the request finished before the client dropped it; make it longer")
    except httpx.TimeoutException:
        pass
    deadline = time.monotonic() + 15
    while True:
        now = gauges(server)
        if (now["brigade:num_requests_running"], now["brigade:num_requests_waiting"],
                now["brigade:kv_cache_usage_perc"]) == (0, 0, 0):
            break
        assert time.monotonic() < deadline, f"the dropped request's work went on: {now}"
        time.sleep(0.3)
    assert httpx.get(server.url("/health")).status_code == 200


def test_sigterm_cuts_a_running_request_at_the_shutdown_timeout_without_a_traceback(server):
    result: dict[str, object] = {}

    def post() -> None:
        try:
            result["response"] = pooling(server, long_body(), timeout=60)
        except httpx.HTTPError as exc:
            result["response"] = exc

    thread = threading.Thread(target=post)
    thread.start()
    deadline = time.monotonic() + 30
    while gauges(server)["brigade:num_requests_running"] == 0:  # the request reached the engine
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    thread.join(60)
    cut_after = time.monotonic() - sent
    response = result["response"]
    assert isinstance(response, httpx.Response), f"the client got {response!r}, not a response"
    error = error_of(response, 503)
    assert error["code"] == "shutting_down" and error["type"] == "server_error", error
    assert SHUTDOWN_TIMEOUT_S - 0.5 <= cut_after <= SHUTDOWN_TIMEOUT_S + 5, cut_after
    assert server.proc.wait(timeout=30) == 0
    log = server.log_tail(1_000_000)
    assert "Traceback" not in log, log[-4000:]
