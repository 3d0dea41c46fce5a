"""Bodies a fuzzer or a hostile client sends: lone surrogates, 70-bit seeds, absurd nesting, message roles
OpenAI does not know, strings or numbers where OpenAI wants a JSON boolean. Each gets a 400 in OpenAI's
shape (never a 500, never a lenient reading), and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest
from remote_server import RemoteServer

MODEL = "smollm2"


@pytest.fixture(scope="module")
def server(smollm2_path):
    s = RemoteServer(smollm2_path, ["--max-model-len", "128", "--served-model-name", MODEL])
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


# ---- message roles ----------------------------------------------------------------------------------

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def test_unknown_chat_role_is_a_400_naming_it_and_the_allowed_ones(server):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"},
                                                 {"role": "wizard", "content": "Cast a spell."}])
    error = info.value.body
    assert info.value.status_code == 400 and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    assert "messages.1.role" in error["message"] and "'wizard'" in error["message"]
    assert all(f"'{role}'" in error["message"] for role in ROLES), error["message"]
    out = client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0,
                                         messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.completion_tokens >= 1


@pytest.mark.parametrize("role", ["developer", "system"])
def test_every_openai_role_is_accepted(server, role):
    body = {"messages": [{"role": role, "content": "Answer briefly."}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "and?"}],
            "max_tokens": 2}
    response = httpx.post(server.url("/v1/chat/completions"), json=body, timeout=60)
    assert response.status_code == 200, response.text
    tool_turn = [{"role": "user", "content": "hi"}, {"role": "function", "name": "f", "content": "1"},
                 {"role": "tool", "tool_call_id": "c1", "content": "2"}]
    tokens = httpx.post(server.url("/tokenize"), json={"messages": tool_turn}, timeout=60)
    assert tokens.status_code == 200 and tokens.json()["count"] > 0, tokens.text
    wizard = httpx.post(server.url("/tokenize"), json={"messages": [{"role": "wizard", "content": "x"}]}, timeout=60)
    assert wizard.status_code == 400 and wizard.json()["error"]["param"] == "messages"


# ---- strict booleans --------------------------------------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "Hello", "max_tokens": 2}
NOT_BOOLEANS = [
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {**CHAT, "stream": 1}, "stream"),
    ("/v1/chat/completions", {**CHAT, "stream": "true"}, "stream"),
    ("/v1/chat/completions", {**CHAT, "logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": 0}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "ignore_eos": "false"}, "ignore_eos"),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options"),
    ("/v1/completions", {**COMPLETION, "stream": "yes"}, "stream"),
    ("/v1/completions", {**COMPLETION, "echo": 1}, "echo"),
    ("/v1/completions", {**COMPLETION, "echo": "on"}, "echo"),
    ("/v1/completions", {**COMPLETION, "ignore_eos": "no"}, "ignore_eos"),
    ("/v1/completions", {**COMPLETION, "skip_special_tokens": 0}, "skip_special_tokens"),
    ("/v1/completions", {**COMPLETION, "stream": True, "stream_options": {"include_usage": 1}},
     "stream_options"),
]


@pytest.mark.parametrize("path,body,param", NOT_BOOLEANS, ids=[f"{p[2]}-{i}" for i, p in enumerate(NOT_BOOLEANS)])
def test_non_boolean_for_a_boolean_field_is_a_400(server, path, body, param):
    response = httpx.post(server.url(path), json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")  # not a stream
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "valid boolean" in error["message"] and error["message"].startswith(param), error["message"]


def test_json_booleans_still_work(server):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0, stream=True,
        stream_options={"include_usage": True}, logprobs=True, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert any(c.choices and c.choices[0].logprobs for c in chunks)
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0, echo=True,
                                    stream=False, extra_body={"ignore_eos": False, "skip_special_tokens": True})
    assert out.choices[0].text.startswith("Hello")
    response = httpx.post(server.url("/v1/chat/completions"), timeout=60,
                          json={**CHAT, "stream": False, "logprobs": False, "ignore_eos": False})
    assert response.status_code == 200 and response.json()["choices"][0]["logprobs"] is None
