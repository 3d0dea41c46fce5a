"""Request field values refused as vLLM and OpenAI refuse them, each a 400 in OpenAI's shape naming the field
while the server keeps serving: JSON numbers of thousands of digits, a ``structured_outputs.json`` that is no
schema, out-of-vocabulary ``stop_token_ids`` before a stream starts, and the ``priority``, ``cache_salt`` and
``bad_words`` values vLLM refuses (the accepted ones still served)."""

from __future__ import annotations

import openai
import pytest
from shared_server import MODEL, QUESTION, assert_400, assert_openai_400, assert_still_serving


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


@pytest.mark.parametrize("value", [5, [1], 1.5])
def test_structured_outputs_json_of_a_wrong_type_says_what_json_accepts(http, value):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "structured_outputs": {"json": value}}
    error = assert_400(http.post("/v1/completions", json=body), "structured_outputs")
    assert "JSON schema" in error["message"] and "boolean" not in error["message"], error


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
