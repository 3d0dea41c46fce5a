"""Review fixes of the OpenAI server, end to end on a real ``brigade serve`` with the official client:
huge prompts refused without tokenizing them, token-id lists checked before a stream starts, the 405's
Allow header, CORS preflights, and priority / cache_salt / bad_words values vLLM refuses.

Every refusal is a 4xx in OpenAI's shape, and the server keeps serving after it.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from remote_server import RemoteServer

MODEL = "smollm2"
MAX_MODEL_LEN = 128
HUGE = "a" * 8_000_000  # tokenizing this takes seconds on one CPU thread; the pre-check takes nothing
QUESTION = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN),
                                      "--num-gpu-blocks-override", "32", "--max-num-seqs", "4",
                                      "--disable-log-requests"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


def assert_openai_400(info, param: str) -> dict:
    """The refusal is a 400 invalid_request_error in OpenAI's shape naming ``param``; returns the error."""
    error = info.value.body
    assert info.value.status_code == 400 and set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


def assert_still_serving(client) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert out.choices[0].finish_reason in ("length", "stop")


# ---- 1. huge prompts: refused from their length in characters, before tokenizing ------------------------

@pytest.mark.parametrize("prompt", [HUGE, ["Hello", HUGE]], ids=["str", "list"])
def test_huge_completion_prompt_is_refused_without_tokenizing(server, client, prompt):
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    error = assert_openai_400(info, "prompt")
    assert "at least" in error["message"] and str(MAX_MODEL_LEN) in error["message"], error
    assert time.monotonic() - started < 60  # loose: tokenizing would be seconds, not the reason to fail
    assert_still_serving(client)


def test_huge_chat_prompt_is_refused_without_tokenizing(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": HUGE}], max_tokens=2)
    error = assert_openai_400(info, "messages")
    assert "at least" in error["message"], error
    assert_still_serving(client)


def test_prompt_just_over_the_limit_still_gets_the_exact_count(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hello " * (MAX_MODEL_LEN + 10), max_tokens=2)
    error = assert_openai_400(info, "prompt")
    assert "at least" not in error["message"] and "tokens" in error["message"], error


def test_small_request_is_served_while_a_huge_one_is_refused(server, client):
    with httpx.Client(timeout=120) as http:
        huge = http.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": HUGE, "max_tokens": 2})
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "prompt"
    assert_still_serving(client)


# ---- 2. token-id lists are checked before a stream starts --------------------------------------------

@pytest.mark.parametrize("ids", [[-1], [10**9]])
def test_out_of_vocab_stop_token_ids_in_a_chat_stream_is_a_400(client, ids):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, stream=True,
                                       extra_body={"stop_token_ids": ids})
    assert_openai_400(info, "stop_token_ids")
    assert_still_serving(client)


@pytest.mark.parametrize("ids", [[-1], [10**9]])
def test_out_of_vocab_stop_token_ids_in_a_completion_stream_is_a_400(client, ids):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, stream=True,
                                  extra_body={"stop_token_ids": ids})
    assert_openai_400(info, "stop_token_ids")
    assert_still_serving(client)


def test_in_vocab_stop_token_ids_stream(client):
    stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, stream=True,
                                       extra_body={"stop_token_ids": [0]})
    assert [c for c in stream]


# ---- 3. 405 keeps its Allow header -------------------------------------------------------------------

def test_wrong_method_is_a_405_with_allow(server):
    response = httpx.get(server.url("/v1/completions"), timeout=30)
    assert response.status_code == 405
    assert "POST" in response.headers.get("allow", ""), response.headers
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 405


# ---- 4. CORS -----------------------------------------------------------------------------------------

def test_cors_preflight_is_answered(server):
    response = httpx.options(server.url("/v1/chat/completions"), timeout=30,
                             headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST",
                                      "Access-Control-Request-Headers": "content-type,authorization"})
    assert response.status_code == 200, response.text
    assert response.headers.get("access-control-allow-origin") in ("*", "http://example.com")
    assert "POST" in response.headers.get("access-control-allow-methods", "")


def test_cors_header_on_a_plain_request(server):
    response = httpx.get(server.url("/v1/models"), headers={"Origin": "http://example.com"}, timeout=30)
    assert response.status_code == 200
    assert response.headers.get("access-control-allow-origin") == "*"


def test_cors_flags_limit_the_origins(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--max-model-len", str(MAX_MODEL_LEN), "--num-gpu-blocks-override", "32",
                                      "--allowed-origins", '["https://app.example"]',
                                      "--allowed-methods", '["POST"]', "--allow-credentials"])
    try:
        ask = {"Access-Control-Request-Method": "POST"}
        allowed = httpx.options(srv.url("/v1/completions"), headers={"Origin": "https://app.example", **ask},
                                timeout=30)
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert allowed.headers["access-control-allow-credentials"] == "true"
        refused = httpx.options(srv.url("/v1/completions"), headers={"Origin": "https://evil.example", **ask},
                                timeout=30)
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    finally:
        srv.stop()


# ---- 5. priority, cache_salt, bad_words --------------------------------------------------------------

@pytest.mark.parametrize("extra,param", [
    ({"priority": 1}, "priority"),
    ({"priority": -3}, "priority"),
    ({"cache_salt": ""}, "cache_salt"),
    ({"bad_words": [""]}, "bad_words"),
    ({"bad_words": ["ok", ""]}, "bad_words"),
    ({"bad_words": [f"w{i}" for i in range(4097)]}, "bad_words"),  # more than MAX_BAD_WORDS
    ({"bad_words": ["a" * 3_000_000]}, "bad_words"),  # certainly longer than any output of this context
])
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_values_vllm_refuses_are_a_400(client, extra, param, route):
    with pytest.raises(openai.BadRequestError) as info:
        if route == "chat":
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, extra_body=extra)
        else:
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, extra_body=extra)
    error = assert_openai_400(info, param)
    if param == "priority":
        assert "--scheduling-policy priority" in error["message"], error
    assert_still_serving(client)


def test_accepted_values_still_served(client):
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                    extra_body={"priority": 0, "cache_salt": "tenant-a", "bad_words": ["zebra"]})
    assert out.choices[0].finish_reason in ("length", "stop")
    for route in ("completions", "chat"):  # an empty list is no bad words (it was a 500: max() of nothing)
        if route == "chat":
            out = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                                 extra_body={"bad_words": []})
        else:
            out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, extra_body={"bad_words": []})
        assert out.choices[0].finish_reason in ("length", "stop")


def test_thousands_of_bad_words_are_tokenized_off_the_event_loop(client, server):
    # 4096 words (the most accepted), tokenized on the tokenizer thread in linear time; /health answers meanwhile
    # (they used to be tokenized on the event loop with a quadratic duplicate check: 16k words held every
    # request for 8 s, 200k froze the server).
    import threading

    words = [f"zq{i}x" for i in range(4096)]
    done = {}

    def ask():
        done["out"] = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                                extra_body={"bad_words": words})

    worker = threading.Thread(target=ask)
    worker.start()
    health = httpx.get(server.url("/health"), timeout=5)
    worker.join(timeout=120)
    assert health.status_code == 200
    assert done["out"].choices[0].finish_reason in ("length", "stop")


def test_bad_words_token_ids_keep_first_seen_order_without_repeats(smollm2_path):
    from brigade.config import ModelConfig
    from brigade.engine.input_processor import bad_words_token_ids
    from brigade.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(ModelConfig(model=str(smollm2_path)))
    ids = bad_words_token_ids(tokenizer, ["Paris", "Paris", " Paris", "London"])
    want = []
    for word in ("Paris", " Paris", "London", " London"):
        seq = tokenizer.encode(word, add_special_tokens=False)
        if seq not in want:
            want.append(seq)
    assert ids == want


def test_echo_with_max_tokens_0_scores_the_prompt_only(client):
    # lm-eval's loglikelihood requests (as vLLM serves them): the prompt and its logprobs, nothing generated.
    out = client.completions.create(model=MODEL, prompt="Hello world, how are", max_tokens=0, echo=True, logprobs=1)
    choice = out.choices[0]
    assert choice.text == "Hello world, how are"
    assert "".join(choice.logprobs.tokens) == "Hello world, how are"
    assert choice.logprobs.token_logprobs[0] is None and all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    assert choice.logprobs.text_offset[0] == 0 and choice.finish_reason == "length"
    chunks = list(client.completions.create(model=MODEL, prompt="Hello world, how are", max_tokens=0, echo=True,
                                            logprobs=1, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "Hello world, how are"
    assert chunks[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as info:  # without echo, 0 tokens is still refused
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=0)
    assert_openai_400(info, "max_tokens")
