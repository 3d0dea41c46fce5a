"""One bad sequence fails only its request, on a real ``brigade serve`` of SmolLM2: a request whose output cannot be
detokenized ends with an error (a 500 naming the failure, or one error event and [DONE] in a stream) while a
concurrent stream finishes normally, its KV blocks come back, and the server goes on serving.

The trigger is real: the server runs with ``--tokenizer`` pointing at SmolLM2's tokenizer whose decoder also
rewrites "Paris." as "Rome.". That decoder is not prefix-stable (the text of " Paris" changes once "." follows), so
tokenizers' DecodeStream raises "Invalid prefix encountered" on the tokens after " Paris.", which SmolLM2 writes
greedily after "The capital of France is". Every other output decodes as usual.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from remote_server import RemoteServer, error_of

FAILING_PROMPT = "The capital of France is"  # greedy: " Paris. ..."
COUNTING_PROMPT = "1, 2, 3, 4, 5,"  # greedy: " 6, 7, 8, ..." (no "Paris.")
COUNTING_TOKENS = 24


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    tokenizer_dir = tmp_path_factory.mktemp("rewriting-tokenizer")
    shutil.copy(smollm2_path / "tokenizer_config.json", tokenizer_dir)
    spec = json.loads((smollm2_path / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Sequence", "decoders": [
        spec["decoder"], {"type": "Replace", "pattern": {"String": "Paris."}, "content": "Rome."}]}
    (tokenizer_dir / "tokenizer.json").write_text(json.dumps(spec))
    srv = RemoteServer(smollm2_path, ["--tokenizer", str(tokenizer_dir), "--max-model-len", "256",
                                      "--disable-log-requests"])
    yield srv
    srv.stop()


def completion(server: RemoteServer, prompt: str, max_tokens: int, **fields) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **fields}
    return httpx.post(server.url("/v1/completions"), json=body, timeout=120)


def stream_payloads(server: RemoteServer, prompt: str, max_tokens: int) -> list[str]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=120) as response:
        assert response.status_code == 200
        return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def assert_idle(server: RemoteServer) -> None:
    """Nothing runs or waits, and no KV block is in use (the failed request's were freed)."""
    names = ("brigade:num_requests_running", "brigade:num_requests_waiting", "brigade:kv_cache_usage_perc")
    deadline = time.monotonic() + 10
    while True:
        lines = httpx.get(server.url("/metrics"), timeout=30).text.splitlines()
        values = [float(line.split()[-1]) for line in lines if line.startswith(names)]
        if len(values) == 3 and values == [0.0, 0.0, 0.0]:
            return
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)


def test_a_request_that_cannot_be_detokenized_fails_alone(server):
    with ThreadPoolExecutor(2) as pool:
        other = pool.submit(stream_payloads, server, COUNTING_PROMPT, COUNTING_TOKENS)
        time.sleep(0.3)  # the other stream is running when the failing request fails
        failed = completion(server, FAILING_PROMPT, 16)
        other_payloads = other.result()
    error = error_of(failed, 500)
    assert error["type"] == "server_error", error
    assert "detokenized" in error["message"] and "Invalid prefix" in error["message"], error
    assert other_payloads[-1] == "[DONE]" and all('"error"' not in p for p in other_payloads), other_payloads
    chunks = [json.loads(p) for p in other_payloads[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in chunks).startswith(" 6, 7, 8")
    assert_idle(server)


def test_a_stream_that_cannot_be_detokenized_ends_with_one_error_event(server):
    payloads = stream_payloads(server, FAILING_PROMPT, 16)
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["type"] == "server_error" and "Invalid prefix" in error["message"], error
    assert all('"error"' not in p for p in payloads[:-2])
    assert_idle(server)


def test_the_server_goes_on_serving(server):
    assert httpx.get(server.url("/health")).status_code == 200
    response = completion(server, COUNTING_PROMPT, 8)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"].startswith(" 6, 7,")
