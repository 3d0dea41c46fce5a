"""``brigade chat``: errors are one line with the server's message, the server's address is taken with or
without /v1, a refused message at a terminal does not end the conversation, input that is not UTF-8 is named.
Real subprocesses and a real server on loopback; no mocks."""

from __future__ import annotations

import os
import pty
import subprocess

import pytest
from cli_runner import assert_one_line, run_cli
from cli_server import MAX_MODEL_LEN, MODEL_NAME
from remote_server import brigade_command, find_free_port


def test_chat_unknown_model_is_one_line_with_the_servers_message(server):
    proc = run_cli("chat", "--url", server.url("/v1"), "--model", "nope", stdin="hi\n")
    assert_one_line(proc, "brigade chat", f"The model 'nope' does not exist; this server serves '{MODEL_NAME}' "
                                          "(HTTP 404)", status=1)


def test_chat_max_tokens_is_checked_while_parsing():
    for value, needle in (("-10", "argument --max-tokens: must be at least 1, got -10"),
                          ("0", "argument --max-tokens: must be at least 1, got 0"),
                          ("many", "argument --max-tokens: expected a whole number of at least 1, got 'many'")):
        assert_one_line(run_cli("chat", "--max-tokens", value, stdin="hi\n"), "brigade chat", needle)


def test_chat_takes_the_servers_address_with_or_without_v1(server):
    for url in (server.base_url, server.base_url + "/", server.url("/v1"), server.url("/v1/")):
        proc = run_cli("chat", "--url", url, "--max-tokens", "4", stdin="Say hello.\n")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.startswith("> ") and len(proc.stdout.strip()) > 2, proc.stdout
        assert proc.stderr == "", proc.stderr[-3000:]  # no log lines amid the conversation
    assert_one_line(run_cli("chat", "--url", "127.0.0.1:8000"), "brigade chat",
                    "argument --url: '127.0.0.1:8000' is not an http(s) URL; give http(s)://HOST:PORT or its /v1")


def test_chat_context_overflow_from_a_pipe_is_one_line_and_status_1(server):
    proc = run_cli("chat", "--url", server.base_url, "--max-tokens", "4", stdin="word " * 400 + "\n")
    line = assert_one_line(proc, "brigade chat", "(HTTP 400)", status=1)
    assert str(MAX_MODEL_LEN) in line, line


def test_chat_unreachable_server_is_one_line():
    url = f"http://127.0.0.1:{find_free_port()}"
    for argv in ((), ("--model", "x")):  # found listing the models, or at the first message
        proc = run_cli("chat", "--url", url, *argv, stdin="hi\n")
        assert_one_line(proc, "brigade chat", f"cannot reach {url}/v1", status=1)


def test_interactive_chat_goes_on_after_a_refused_message(server):
    """At a terminal, a 400 (here the context overflowing) drops that message: the next one is answered."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen([*brigade_command(), "chat", "--url", server.base_url, "--max-tokens", "4"],
                                stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.write(controller, ("word " * 400 + "\nSay hello.\n\n").encode())
        out, err = proc.communicate(timeout=180)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and len(err.splitlines()) == 2, err[-3000:]
    first, error = err.splitlines()  # without --model, at a terminal it says which model answers
    assert first == f"chatting with {MODEL_NAME} (the server's first model) at {server.base_url}/v1; an empty line quits"
    assert error.startswith("brigade chat: error: ") and "(HTTP 400)" in error
    assert out.count("> ") == 3 and len(out.replace("> ", "").strip()) > 0, out  # the second message's answer


@pytest.mark.parametrize("encoding", ["utf-8:surrogateescape", "utf-8:strict"])
def test_chat_input_that_is_not_utf8_is_one_line_and_status_1(encoding):
    """The bad line is caught before any request (--model given, so nothing is listed): no server needed. A C
    locale reads stdin with surrogateescape (the bad bytes would fail when the request is encoded), a UTF-8 one
    strictly (they fail in ``input``): both give the same line."""
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    env["PYTHONIOENCODING"] = encoding
    url = f"http://127.0.0.1:{find_free_port()}"
    proc = subprocess.run([*brigade_command(), "chat", "--url", url, "--model", "x", "--max-tokens", "4"],
                          input=b"\xff\xfe hello\n", capture_output=True, timeout=120, env=env)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, stderr[-3000:]
    assert stderr.splitlines() == ["brigade chat: error: the input line is not valid UTF-8; type or pipe UTF-8 "
                                   "text"], stderr[-3000:]


def test_chat_refused_for_its_key_hints_at_api_key():
    """A 401 (a server started with --api-key) names --api-key, not --url; the server here is a stub that answers
    every request as ``brigade serve --api-key`` answers a wrong key."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Refuses(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"error": {"message": "Invalid API key", "type": "invalid_request_error",
                                         "param": None, "code": "invalid_api_key"}}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    stub = ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    try:
        proc = run_cli("chat", "--url", f"http://127.0.0.1:{stub.server_address[1]}", stdin="hi\n")
    finally:
        stub.shutdown()
    line = assert_one_line(proc, "brigade chat", "Invalid API key (HTTP 401)", status=1)
    assert "--api-key" in line and "--url" not in line, line
