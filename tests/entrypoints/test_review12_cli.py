"""A fresh user's review of the command line (review 12): ``brigade chat``'s errors and URL, KV blocks below the
minimum, vLLM's launch flags, abbreviated flags, ``bench`` lengths and ``--host``/``--port``, and the serve script.
Real subprocesses and a real server on loopback; no mocks."""

from __future__ import annotations

import os
import pty
import subprocess
import time

import pytest
from remote_server import RemoteServer, brigade_command, find_free_port

MODEL_NAME = "smol"
MAX_MODEL_LEN = 128


def run_cli(*argv: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    """``brigade ARGV`` at the default log level (no BRIGADE_LOGGING_LEVEL), as a user runs it."""
    base = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    return subprocess.run([*brigade_command(), *argv], capture_output=True, text=True, timeout=timeout,
                          input=stdin if stdin is not None else "", env={**base, **(env or {})})


def assert_one_line(proc: subprocess.CompletedProcess, prefix: str, needle: str, *, status: int = 2) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == status, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(prefix + ": error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN),
                                      "--max-num-seqs", "4"])
    yield srv
    srv.stop()


# ---- 1: brigade chat ---------------------------------------------------------------------------------------

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
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    assert err.startswith("brigade chat: error: ") and "(HTTP 400)" in err
    assert out.count("> ") == 3 and len(out.replace("> ", "").strip()) > 0, out  # the second message's answer
