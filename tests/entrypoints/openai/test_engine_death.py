"""A real ``brigade serve`` whose EngineCore process is killed mid-stream: every request in flight fails
(a stream ends with one error event and [DONE], a non-streamed request is a 503) and none hangs; then, as
vLLM's server does, the API server shuts down and exits 1 with one error line, so that its supervisor can
restart it. With BRIGADE_KEEP_ALIVE_ON_ENGINE_DEATH=1 it stays up instead, and /health and every /v1 route
answer 503 in OpenAI's shape (new streams too, before any chunk)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from remote_server import RemoteServer

MODEL = "smollm2"


def engine_core_pid(server_pid: int) -> int:
    """The EngineCore child, spawned or forked (another child may be multiprocessing's resource tracker)."""
    children = " ".join(Path(f"/proc/{server_pid}/task/{t}/children").read_text()
                        for t in os.listdir(f"/proc/{server_pid}/task")).split()
    cores = [int(c) for c in children if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(cores) == 1, children
    return cores[0]


def test_killed_engine_fails_requests_in_flight_then_the_server_exits(smollm2_path):
    server = RemoteServer(smollm2_path, ["--max-model-len", "256", "--num-gpu-blocks-override", "32"])
    try:
        body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
        assert httpx.post(server.url("/v1/completions"), json=body, timeout=60).status_code == 200
        long_body = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with ThreadPoolExecutor(3) as pool, \
                httpx.stream("POST", server.url("/v1/completions"), json=long_body, timeout=60) as stream:
            lines = (line for line in stream.iter_lines() if line.startswith("data: "))
            assert "error" not in next(lines)
            # More requests in flight when the engine dies: a non-streamed batch of two prompts, and a
            # streamed chat with n=2. Each must get an error, none may hang (the timeouts would fail them).
            unary = pool.submit(httpx.post, server.url("/v1/completions"), timeout=60,
                                json={**long_body, "stream": False, "prompt": ["Once", "Twice upon a time"]})
            chat = pool.submit(lambda: httpx.post(server.url("/v1/chat/completions"), timeout=60, json={
                "messages": [{"role": "user", "content": "Tell a story"}], "n": 2, "max_tokens": 200,
                "ignore_eos": True, "stream": True}).text)
            next(lines)
            time.sleep(0.5)  # the other requests reach the engine
            os.kill(engine_core_pid(server.proc.pid), signal.SIGKILL)
            rest = list(lines)
            unary_response, chat_text = unary.result(), chat.result()
        assert unary_response.status_code == 503, unary_response.text
        assert unary_response.json()["error"]["code"] == "engine_unavailable"
        chat_events = [line for line in chat_text.splitlines() if line.startswith("data: ")]
        assert chat_events[-1] == "data: [DONE]" and '"engine_unavailable"' in chat_events[-2]
        # The stream ends with one error event, then [DONE].
        assert rest[-1] == "data: [DONE]" and '"engine_unavailable"' in rest[-2]
        assert all('"error"' not in line for line in rest[:-2])
        # Then the server shuts down on its own: exit code 1, the reason as the last line of its output.
        assert server.proc.wait(timeout=30) == 1, server.log_tail()
        last = server.log_tail().strip().splitlines()[-1]
        assert last.startswith("brigade serve: error: the engine died (") and "the server shut down" in last, last
        assert "Traceback" not in server.log_tail()
    finally:
        server.stop()


def test_keep_alive_on_engine_death_answers_503(smollm2_path):
    """A stream in flight when the engine dies stops counting as running; then /health and every /v1 route answer
    503 engine_unavailable in OpenAI's shape, without promising a recovery, and the server stays up."""
    server = RemoteServer(smollm2_path, ["--served-model-name", MODEL, "--max-model-len", "256",
                                         "--num-gpu-blocks-override", "32", "--disable-log-requests"],
                          env={"BRIGADE_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    try:
        assert httpx.head(server.url("/health")).status_code == 200  # load balancers probe with HEAD too
        assert httpx.get(server.url("/v1/models")).status_code == 200
        body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
        assert httpx.post(server.url("/v1/completions"), json=body, timeout=60).status_code == 200
        # A stream in flight when the engine dies: afterwards /metrics must not count it as running.
        started = threading.Event()

        def stream() -> None:
            body = {"model": MODEL, "prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as response:
                for _ in response.iter_lines():
                    started.set()

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(30), "the stream never started"
        running = re.compile(r"^brigade:num_requests_running\{[^}]*\} (\S+)$", re.M)
        deadline = time.monotonic() + 10
        while float(running.search(httpx.get(server.url("/metrics")).text).group(1)) != 1:
            assert time.monotonic() < deadline and reader.is_alive(), "the stream never counted as running"
            time.sleep(0.05)
        os.kill(engine_core_pid(server.proc.pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while httpx.get(server.url("/health")).status_code != 503:
            assert time.monotonic() < deadline, "/health never reported the dead engine"
            time.sleep(0.2)
        assert httpx.head(server.url("/health")).status_code == 503
        reader.join(30)
        assert float(running.search(httpx.get(server.url("/metrics")).text).group(1)) == 0
        for response in (httpx.get(server.url("/v1/models")), httpx.get(server.url(f"/v1/models/{MODEL}")),
                         httpx.post(server.url("/v1/completions"), json={"prompt": "Hi", "max_tokens": 2}),
                         httpx.get(server.url("/health"))):
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "engine_unavailable" and error["type"] == "server_error", error
            assert "retry" not in error["message"].lower() and "restart" in error["message"], error
        for response in (httpx.post(server.url("/v1/completions"), json=body),
                         httpx.post(server.url("/v1/completions"), json={**body, "stream": True}),
                         httpx.post(server.url("/v1/chat/completions"),
                                    json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})):
            assert response.status_code == 503
            assert response.json()["error"]["type"] == "server_error"
        time.sleep(2)  # longer than the watch interval: the server must still be up
        assert server.proc.poll() is None and httpx.get(server.url("/version")).status_code == 200
    finally:
        server.stop()
