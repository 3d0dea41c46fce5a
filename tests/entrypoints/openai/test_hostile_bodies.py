"""Bodies a fuzzer or a hostile client sends: lone surrogates, 70-bit seeds, absurd nesting, message roles
OpenAI does not know, strings or numbers where OpenAI wants a JSON boolean, strings, booleans, decimals or
NaN where it wants a JSON number. Each gets a 400 in OpenAI's shape (never a 500, never a lenient reading),
and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest
from shared_server import MODEL


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
    assert "messages[1].role" in error["message"] and "'wizard'" in error["message"]
    assert all(f"'{role}'" in error["message"] for role in ROLES), error["message"]
    out = client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0,
                                         messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.completion_tokens >= 1


def test_null_content_is_refused_except_for_assistant_tool_calls(server):
    """As OpenAI: a user (system, tool...) message needs content; only an assistant turn may carry tool calls
    and no text."""
    null_user = {"messages": [{"role": "user", "content": None}], "max_tokens": 2}
    response = httpx.post(server.url("/v1/chat/completions"), json=null_user, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "messages", response.text
    assert "messages[0].content: a user message needs content" in error["message"]
    tool_turn = {"messages": [{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": None, "tool_calls": [
                                  {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                              {"role": "tool", "tool_call_id": "c1", "content": "1"}], "max_tokens": 2}
    response = httpx.post(server.url("/v1/chat/completions"), json=tool_turn, timeout=60)
    assert response.status_code == 200, response.text


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


# ---- strict numbers ---------------------------------------------------------------------------------

NOT_NUMBERS = [
    # integer fields: a numeric string, a decimal (even a whole one) or a boolean is not an integer
    ("/v1/completions", {**COMPLETION, "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 5.0}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "n": "2"}, "n"),
    ("/v1/completions", {**COMPLETION, "seed": "3"}, "seed"),
    ("/v1/completions", {**COMPLETION, "seed": 3.5}, "seed"),
    ("/v1/completions", {**COMPLETION, "logprobs": "2"}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "logprobs": True}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "top_k": "5"}, "top_k"),
    ("/v1/completions", {**COMPLETION, "min_tokens": "1"}, "min_tokens"),
    ("/v1/completions", {**COMPLETION, "best_of": "1"}, "best_of"),
    ("/v1/completions", {**COMPLETION, "prompt_logprobs": "1"}, "prompt_logprobs"),
    ("/v1/completions", {**COMPLETION, "priority": "0"}, "priority"),
    ("/v1/completions", {**COMPLETION, "stop_token_ids": ["2"]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "allowed_token_ids": [1, "2"]}, "allowed_token_ids"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": "4"}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 4.0}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "n": "2"}, "n"),
    ("/v1/chat/completions", {**CHAT, "seed": "3"}, "seed"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": "1"}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_k": "5"}, "top_k"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": "1"}, "min_tokens"),
    ("/detokenize", {"tokens": ["1", "2"]}, "tokens"),
    # number fields: a numeric string or a boolean is not a number
    ("/v1/completions", {**COMPLETION, "temperature": "0.5"}, "temperature"),
    ("/v1/completions", {**COMPLETION, "temperature": True}, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": "0.9"}, "top_p"),
    ("/v1/completions", {**COMPLETION, "min_p": "0.1"}, "min_p"),
    ("/v1/completions", {**COMPLETION, "presence_penalty": "0"}, "presence_penalty"),
    ("/v1/completions", {**COMPLETION, "frequency_penalty": "0.1"}, "frequency_penalty"),
    ("/v1/completions", {**COMPLETION, "repetition_penalty": "1.1"}, "repetition_penalty"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"100": "5"}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": "0.9"}, "top_p"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": "0"}, "presence_penalty"),
    ("/v1/chat/completions", {**CHAT, "frequency_penalty": False}, "frequency_penalty"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"100": True}}, "logit_bias"),
]


@pytest.mark.parametrize("path,body,param", NOT_NUMBERS,
                         ids=[f"{p[2]}-{i}" for i, p in enumerate(NOT_NUMBERS)])
def test_non_number_for_a_number_field_is_a_400(server, path, body, param):
    response = httpx.post(server.url(path), json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"].startswith(param), error["message"]
    assert "valid integer" in error["message"] or "valid number" in error["message"], error["message"]
    ok = httpx.post(server.url(path.replace("/detokenize", "/v1/completions")), timeout=60,
                    json=COMPLETION if path != "/v1/chat/completions" else CHAT)
    assert ok.status_code == 200, ok.text


# json.loads takes these non-JSON tokens; OpenAI refuses them, and no sampler wants an infinite temperature
NOT_FINITE = [
    ("temperature", b"Infinity"), ("temperature", b"NaN"), ("top_p", b"-Infinity"),
    ("repetition_penalty", b"Infinity"), ("presence_penalty", b"NaN"),
]


@pytest.mark.parametrize("param,token", NOT_FINITE)
def test_nan_or_infinity_is_a_400(server, param, token):
    body = b'{"prompt": "Hello", "max_tokens": 2, "%s": %s}' % (param.encode(), token)
    response = httpx.post(server.url("/v1/completions"), content=body, timeout=60,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "finite number" in error["message"], error["message"]


def test_numeric_strings_are_400s_through_the_openai_client(server):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens="5")
    assert info.value.status_code == 400 and info.value.body["param"] == "max_tokens"
    assert "got '5'" in info.value.body["message"], info.value.body
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=2, temperature="0.5")
    assert info.value.status_code == 400 and info.value.body["param"] == "temperature"
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert out.usage.completion_tokens >= 1


def test_json_numbers_still_work(server):
    """Integers for number fields, decimals, token-id prompts and logit_bias (string keys, int or float
    values) are all taken, and mean what they say."""
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)
    out = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=3, n=2, seed=3, logprobs=2, temperature=1, top_p=1,
        presence_penalty=0, frequency_penalty=0,
        extra_body={"top_k": 5, "min_p": 0, "repetition_penalty": 1, "min_tokens": 1, "ignore_eos": True,
                    "priority": 0, "stop_token_ids": [2]})
    assert len(out.choices) == 2 and out.usage.completion_tokens == 6
    # logprobs=2: the two best candidates, plus the sampled token when it is not one of them
    assert all(len(choice.logprobs.tokens) == 3 for choice in out.choices)
    assert all(2 <= len(top) <= 3 for choice in out.choices for top in choice.logprobs.top_logprobs)
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0.5, top_p=0.9,
                                    presence_penalty=0.5, frequency_penalty=-0.5,
                                    extra_body={"min_p": 0.05, "repetition_penalty": 1.1})
    assert out.usage.completion_tokens >= 1

    # token-id prompts, one and a batch
    ids = httpx.post(server.url("/tokenize"), json={"prompt": "The capital of France is"},
                     timeout=60).json()["tokens"]
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0)
    assert out.usage.prompt_tokens == len(ids)
    out = client.completions.create(model=MODEL, prompt=[ids, ids[:2]], max_tokens=2, temperature=0)
    assert len(out.choices) == 2 and out.choices[0].text == client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=2, temperature=0).choices[0].text

    # logit_bias: the keys are token ids as JSON strings, the values JSON integers or decimals
    forced = httpx.post(server.url("/tokenize"), json={"prompt": " banana"}, timeout=60).json()["tokens"][-1]
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0,
                                    logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    expected = httpx.post(server.url("/detokenize"), json={"tokens": [forced] * 3}, timeout=60).json()["prompt"]
    assert out.choices[0].text == expected
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_completion_tokens=3, temperature=0, logit_bias={str(forced): 99.5},
                                          logprobs=True, top_logprobs=1, seed=1, n=1, top_p=1.0,
                                          extra_body={"ignore_eos": True, "top_k": 1, "min_tokens": 0})
    assert chat.usage.completion_tokens == 3 and chat.choices[0].message.content == expected
    assert all(len(entry.top_logprobs) == 1 for entry in chat.choices[0].logprobs.content)
    back = httpx.post(server.url("/detokenize"), json={"tokens": ids}, timeout=60)
    assert back.status_code == 200 and back.json()["prompt"] == "The capital of France is"


@pytest.mark.parametrize("best_of", [0, -3])
def test_best_of_below_one_is_a_range_error(server, best_of):
    response = httpx.post(server.url("/v1/completions"), json={**COMPLETION, "best_of": best_of}, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "best_of" and error["message"] == f"best_of must be at least 1, got {best_of}"


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
def test_stream_options_without_stream_is_a_400(server, path, body):
    """As OpenAI and vLLM: stream_options only mean something for a stream."""
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60)
    create = client.chat.completions.create if "chat" in path else client.completions.create
    with pytest.raises(openai.BadRequestError) as info:
        create(model=MODEL, **body, stream=False, stream_options={"include_usage": True})
    assert info.value.body["param"] == "stream_options" and "stream=true" in info.value.body["message"]
