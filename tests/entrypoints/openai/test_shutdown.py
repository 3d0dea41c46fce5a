"""SIGTERM on a real ``brigade serve``: in-flight requests run on for --shutdown-timeout, the ones still
running then end cleanly (one 503 "shutting_down" error event and [DONE], or a 503 body), new
connections are refused, and the server and its EngineCore exit."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
from remote_server import RemoteServer

SHUTDOWN_TIMEOUT_S = 8.0


def stream_events(server, body: dict, first: threading.Event) -> list[str]:
    """POST a stream; set ``first`` on its first data event; return every data payload."""
    events = []
    with httpx.stream("POST", server.url("/v1/completions"), json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
                first.set()
    return events


def test_sigterm_drains_in_flight_requests_then_cuts_the_rest(smollm2_path):
    server = RemoteServer(smollm2_path, ["--max-model-len", "1024", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
                                        "--disable-log-requests"])
    try:
        core_pids = [p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)]
        short_started, long_started = threading.Event(), threading.Event()
        long_body = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True, "temperature": 0}
        with ThreadPoolExecutor(3) as pool:
            short = pool.submit(stream_events, server, {"prompt": "Hello", "max_tokens": 4, "ignore_eos": True,
                                                        "temperature": 0}, short_started)
            long = pool.submit(stream_events, server, long_body, long_started)
            assert short_started.wait(120) and long_started.wait(120)
            unary = pool.submit(httpx.post, server.url("/v1/completions"), json=long_body, timeout=120)
            time.sleep(0.5)  # let the unary request reach the engine
            sent = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            try:
                httpx.get(server.url("/health"), timeout=5)
                refused = False
            except httpx.TransportError:
                refused = True
            short_events, long_events, unary_response = short.result(), long.result(), unary.result()
            cut_after = time.monotonic() - sent
        assert refused, "the server kept accepting connections while draining"
        # The short stream finished normally inside the drain window.
        assert short_events[-1] == "[DONE]" and all('"error"' not in e for e in short_events), short_events
        assert json.loads(short_events[-2])["choices"][0]["finish_reason"] == "length"
        # The long stream was cut at the timeout with one error event, then [DONE].
        assert long_events[-1] == "[DONE]"
        error = json.loads(long_events[-2])["error"]
        assert error["code"] == "shutting_down" and error["type"] == "server_error"
        assert all('"error"' not in e for e in long_events[:-2]) and len(long_events) > 3
        assert unary_response.status_code == 503 and unary_response.json()["error"]["code"] == "shutting_down"
        assert SHUTDOWN_TIMEOUT_S - 1 <= cut_after <= SHUTDOWN_TIMEOUT_S + 10, cut_after
        assert server.proc.wait(timeout=30) == 0
        assert "received while shutting down" not in server.log_tail(100_000)  # one signal logged as one
        deadline = time.monotonic() + 10
        while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                  for pid in core_pids):
            assert time.monotonic() < deadline, "the EngineCore outlived the server"
            time.sleep(0.2)
    finally:
        server.stop()
