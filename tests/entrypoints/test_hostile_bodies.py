"""Bodies a fuzzer or a hostile client sends: lone surrogates, 70-bit seeds, absurd nesting. Each gets a 400
in OpenAI's shape (never a 500), and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest
from remote_server import RemoteServer


@pytest.fixture(scope="module")
def server(smollm2_path):
    s = RemoteServer(smollm2_path, ["--max-model-len", "128"])
    yield s
    s.stop()


CASES = [
    ("/v1/completions", b'{"prompt": "\\ud800 hi", "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}',
     "messages"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "stop": ["\\ud83d"]}', "stop"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "seed": 1180591620717411303424}', "seed"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "seed": -1180591620717411303424}', "seed"),
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, None),
]


@pytest.mark.parametrize("path,body,param", CASES)
def test_hostile_body_is_a_400(server, path, body, param):
    response = httpx.post(server.url(path), content=body, headers={"Content-Type": "application/json"},
                          timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    ok = httpx.post(server.url("/v1/completions"), json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200
