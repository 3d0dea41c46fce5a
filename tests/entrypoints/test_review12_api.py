"""Review 12 fixes of the OpenAI server, end to end on a real ``brigade serve`` (SmolLM2) with the official client
and httpx: chat_template_kwargs that clash with the template call's own arguments, JSON numbers too long to
read, chat fields that used to be ignored (echo, prompt_logprobs, chat_template), /tokenize's template
options, completions' text_offset around tokens that split a character, structured_outputs.json's message, and
what a server kept alive after its engine died answers.

Every refusal is a 400 invalid_request_error in OpenAI's shape naming the field, never a 500.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import openai
import pytest
from remote_server import RemoteServer
from test_engine_death import engine_core_pid

MODEL = "smollm2"
MAX_MODEL_LEN = 512
QUESTION = [{"role": "user", "content": "Hi"}]
CONTINUED = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
                                      "--num-gpu-blocks-override", "64", "--max-num-seqs", "4",
                                      "--disable-log-requests"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def assert_400(response: httpx.Response, param: str | None) -> dict:
    """A 400 invalid_request_error in OpenAI's shape naming ``param``; returns the error object."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "temperature": 0, **fields}


def tokenize(http: httpx.Client, **fields) -> list[int]:
    response = http.post("/tokenize", json={"model": MODEL, **fields})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


# ---- 1. chat_template_kwargs: template variables override, the call's own arguments are refused ---------

@pytest.mark.parametrize("key", ["tools", "tokenize", "chat_template", "messages", "conversation", "return_dict",
                                 "return_tensors", "self"])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
def test_reserved_chat_template_kwargs_are_a_400_naming_the_key(http, key, route):
    body = chat_body(chat_template_kwargs={key: 1})
    if route == "/tokenize":
        body = {"model": MODEL, "messages": QUESTION, "chat_template_kwargs": {key: 1}}
    error = assert_400(http.post(route, json=body), "chat_template_kwargs")
    assert repr(key) in error["message"] or f"'{key}'" in error["message"], error
    assert "internal" not in error["message"] and "apply_chat_template" not in error["message"], error


def test_chat_template_kwargs_override_the_template_variables(http):
    with_prompt = tokenize(http, messages=QUESTION)
    without = tokenize(http, messages=QUESTION, chat_template_kwargs={"add_generation_prompt": False})
    assert tokenize(http, messages=QUESTION, add_generation_prompt=False) == without
    assert len(without) < len(with_prompt) and with_prompt[:len(without)] == without
    out = http.post("/v1/chat/completions", json=chat_body(chat_template_kwargs={"add_generation_prompt": False}))
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["prompt_tokens"] == len(without)
    # continue_final_message from the kwargs continues the assistant's message, as the request field does.
    continued = tokenize(http, messages=CONTINUED, chat_template_kwargs={"continue_final_message": True})
    assert continued == tokenize(http, messages=CONTINUED, add_generation_prompt=False, continue_final_message=True)
    out = http.post("/v1/chat/completions", json=chat_body(messages=CONTINUED,
                                                          chat_template_kwargs={"continue_final_message": True}))
    assert out.status_code == 200 and out.json()["usage"]["prompt_tokens"] == len(continued), out.text


def test_free_template_variables_and_documents_are_passed(http):
    for kwargs in ({"enable_thinking": False}, {"documents": [{"title": "a", "text": "b"}]}):
        out = http.post("/v1/chat/completions", json=chat_body(chat_template_kwargs=kwargs))
        assert out.status_code == 200, out.text


@pytest.mark.parametrize("kwargs", [{"documents": 1}, {"documents": [1]}, {"add_generation_prompt": "yes"},
                                    {"continue_final_message": 1},
                                    {"add_generation_prompt": True, "continue_final_message": True}])
def test_template_kwargs_the_template_cannot_take_are_a_400(http, kwargs):
    error = assert_400(http.post("/v1/chat/completions", json=chat_body(messages=CONTINUED,
                                                                       chat_template_kwargs=kwargs)),
                       "chat_template_kwargs")
    assert "internal" not in error["message"], error


# ---- 2. a JSON number too long for Python to read ------------------------------------------------------

@pytest.mark.parametrize("route,fields", [("/v1/completions", '"prompt":"hi","max_tokens":'),
                                          ("/tokenize", '"prompt":"hi","add_special_tokens":true,"x":')])
def test_a_number_of_thousands_of_digits_is_a_400(http, route, fields):
    body = "{" + fields + "9" * 5000 + "}"
    response = http.post(route, content=body, headers={"content-type": "application/json"})
    error = assert_400(response, None)
    assert error["message"] == "the request body is not valid JSON: it holds a number of more than 4300 digits", error



@pytest.mark.parametrize("digits", [5000, 4000])  # past int()'s 4,300-digit limit, and a token id out of range
def test_a_logit_bias_key_of_thousands_of_digits_is_a_short_400(http, digits):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "logit_bias": {"7" * digits: 1}}
    error = assert_400(http.post("/v1/completions", json=body), "logit_bias")
    assert len(error["message"]) < 120 and "777" in error["message"], error

# ---- 3a. chat fields that were ignored: echo, prompt_logprobs ---------------------------------------

def test_chat_echo_prepends_the_continued_assistant_message(client):
    kwargs = dict(model=MODEL, messages=CONTINUED, max_tokens=3, temperature=0,
                  extra_body={"continue_final_message": True, "add_generation_prompt": False})
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    kwargs["extra_body"]["echo"] = True
    echoed = client.chat.completions.create(**kwargs).choices[0].message.content
    assert echoed == "Once upon a" + plain
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True)
                       if c.choices)
    assert streamed == echoed


def test_chat_echo_after_a_user_message_adds_nothing(client):
    kwargs = dict(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0)
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs, extra_body={"echo": True}).choices[0].message.content == plain


def test_chat_prompt_logprobs_are_returned_as_completions_return_them(http):
    out = http.post("/v1/chat/completions", json=chat_body(prompt_logprobs=2))
    assert out.status_code == 200, out.text
    body = out.json()
    ids = tokenize(http, messages=QUESTION)
    prompt_logprobs = body["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) == body["usage"]["prompt_tokens"] and prompt_logprobs[0] is None
    same = http.post("/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0,
                                              "prompt_logprobs": 2}).json()["choices"][0]["prompt_logprobs"]
    for token_id, entry, expected in zip(ids[1:], prompt_logprobs[1:], same[1:]):
        assert str(token_id) in entry and 2 <= len(entry) <= 3
        assert abs(entry[str(token_id)]["logprob"] - expected[str(token_id)]["logprob"]) < 1e-4
        assert entry[str(token_id)]["decoded_token"] == expected[str(token_id)]["decoded_token"]
    assert http.post("/v1/chat/completions", json=chat_body()).json().get("prompt_logprobs") is None


def test_chat_prompt_logprobs_with_stream_or_out_of_range_is_a_400(http):
    error = assert_400(http.post("/v1/chat/completions", json=chat_body(prompt_logprobs=1, stream=True)),
                       "prompt_logprobs")
    assert "stream" in error["message"], error
    assert_400(http.post("/v1/chat/completions", json=chat_body(prompt_logprobs=21)), "prompt_logprobs")


# ---- 3b. a chat_template in the request is refused, not ignored ----------------------------------------

@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
def test_a_request_chat_template_is_refused(http, route):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    body = chat_body(chat_template=template) if route != "/tokenize" else \
        {"model": MODEL, "messages": QUESTION, "chat_template": template}
    error = assert_400(http.post(route, json=body), "chat_template")
    assert "--chat-template" in error["message"], error
    accepted = http.post(route, json={**body, "chat_template": None})
    assert accepted.status_code == 200, accepted.text


# ---- 4. text_offset where tokens split a character ----------------------------------------------------

SPLIT = {"model": MODEL, "prompt": "Party", "allowed_token_ids": [15107, 232, 227, 28], "max_tokens": 7,
         "logprobs": 0, "temperature": 0}


def streamed_logprobs(http: httpx.Client, body: dict) -> tuple[str, list[int], list[str]]:
    text, offsets, tokens = "", [], []
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[len("data: "):])["choices"][0]
                text += choice["text"]
                offsets += choice["logprobs"]["text_offset"]
                tokens += choice["logprobs"]["tokens"]
    return text, offsets, tokens


def check_offsets(text: str, offsets: list[int], tokens: list[str], start: int = 0) -> None:
    """Non-decreasing, inside the text, and each token whose text is whole characters starts where it says."""
    assert offsets[0] == start and offsets == sorted(offsets) and offsets[-1] <= len(text), (offsets, text)
    for offset, token in zip(offsets, tokens):
        if "\ufffd" not in token:
            assert text[offset:].startswith(token), (offset, token, text)


def test_text_offset_when_tokens_split_a_character(http):
    out = http.post("/v1/completions", json=SPLIT).json()["choices"][0]
    text, offsets, tokens = out["text"], out["logprobs"]["text_offset"], out["logprobs"]["tokens"]
    assert any("\ufffd" in t for t in tokens)  # the case under test: some tokens are parts of a character
    check_offsets(text, offsets, tokens)
    assert streamed_logprobs(http, SPLIT) == (text, offsets, tokens)
    # A token holding part of a character starts where that character starts: the emoji's first byte comes
    # with the space before it, so the tokens after it start at the emoji.
    for i, token in enumerate(tokens):
        if token == "\ufffd" and tokens[i - 1] != "\ufffd":
            assert text[offsets[i]] not in " ,", (offsets, tokens, text)


def test_text_offset_with_echo_continues_after_the_prompt(http):
    body = {**SPLIT, "echo": True}
    out = http.post("/v1/completions", json=body).json()["choices"][0]
    text, offsets, tokens = out["text"], out["logprobs"]["text_offset"], out["logprobs"]["tokens"]
    assert text.startswith("Party") and tokens[:2] == ["Part", "y"]
    assert offsets[:3] == [0, 4, 5]  # the prompt's tokens, then the completion from the prompt's length
    check_offsets(text, offsets, tokens)
    assert streamed_logprobs(http, body) == (text, offsets, tokens)
    plain = http.post("/v1/completions", json=SPLIT).json()["choices"][0]["logprobs"]["text_offset"]
    assert offsets[2:] == [5 + o for o in plain]


@pytest.mark.parametrize("stop,echo", [(["Paris.\n\nThe"], False), (["2018-01"], False), (["2018-01"], True)],
                         ids=["stop-at-start", "stop-late", "stop-late-echo"])
def test_streamed_text_offset_equals_the_full_one_when_a_long_stop_string_cuts_the_text(http, stop, echo):
    """A stop string of several tokens holds their text back while streaming and then cuts it: their offsets
    must still be the full response's (cut to the text's end), never decreasing (they used to be sent with
    the held-back text's positions: [0, 6, 7, 8, 1] against [0, 1, 1, 1, 1])."""
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 20, "temperature": 0,
            "logprobs": 1, "stop": stop, "echo": echo}
    out = http.post("/v1/completions", json=body).json()["choices"][0]
    assert out["finish_reason"] == "stop"
    text, offsets, tokens = out["text"], out["logprobs"]["text_offset"], out["logprobs"]["tokens"]
    assert offsets == sorted(offsets) and offsets[-1] <= len(text), (offsets, text)
    assert streamed_logprobs(http, body) == (text, offsets, tokens)


# ---- 5. structured_outputs.json says what it takes -----------------------------------------------------

@pytest.mark.parametrize("value", [5, [1], 1.5])
def test_structured_outputs_json_of_a_wrong_type_says_what_json_accepts(http, value):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "structured_outputs": {"json": value}}
    error = assert_400(http.post("/v1/completions", json=body), "structured_outputs")
    assert "JSON schema" in error["message"] and "boolean" not in error["message"], error


# ---- 6. a server kept alive after its engine died --------------------------------------------------------

def test_kept_alive_server_answers_503_on_every_v1_route_without_promising_a_recovery(smollm2_path):
    server = RemoteServer(smollm2_path, ["--served-model-name", MODEL, "--max-model-len", "256",
                                         "--num-gpu-blocks-override", "32", "--disable-log-requests"],
                          env={"BRIGADE_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})
    try:
        assert httpx.get(server.url("/v1/models")).status_code == 200
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
        reader.join(30)
        assert float(running.search(httpx.get(server.url("/metrics")).text).group(1)) == 0
        for response in (httpx.get(server.url("/v1/models")), httpx.get(server.url(f"/v1/models/{MODEL}")),
                         httpx.post(server.url("/v1/completions"), json={"prompt": "Hi", "max_tokens": 2}),
                         httpx.get(server.url("/health"))):
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "engine_unavailable" and error["type"] == "server_error", error
            assert "retry" not in error["message"].lower() and "restart" in error["message"], error
        assert httpx.get(server.url("/version")).status_code == 200
    finally:
        server.stop()
