"""Request fields of the OpenAI server as OpenAI and vLLM define them, end to end on a real ``brigade serve``
(SmolLM2, CPU) with the official client and raw HTTP: ``null`` for the fields OpenAI declares nullable, text parts
without text, ``truncate_prompt_tokens`` and ``request_id`` (vLLM's), several ``--served-model-name`` names,
``best_of`` below ``n``, and vLLM's removed ``guided_*`` fields.

The folder's shared server (served under two names); outputs are short and greedy since the CPU is slow.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from shared_server import ALIAS, MAX_MODEL_LEN, MODEL, QUESTION


def error_of(response: httpx.Response, param: str | None, status: int = 400) -> str:
    """The response is an OpenAI-shaped error naming ``param``; returns its message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    return error["message"]


# ---- 1. null means the default for the fields OpenAI declares nullable -----------------------------------

def test_completion_null_n_stream_echo_are_the_defaults(http):
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}
    nulls = http.post("/v1/completions", json={**body, "n": None, "stream": None, "echo": None})
    assert nulls.status_code == 200, nulls.text
    assert nulls.headers["content-type"].startswith("application/json")  # stream: null is not a stream
    plain = http.post("/v1/completions", json=body).json()
    out = nulls.json()
    assert len(out["choices"]) == 1 and out["choices"][0]["text"] == plain["choices"][0]["text"]  # no echo


def test_chat_null_n_stream_logprobs_are_the_defaults(http):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 3, "temperature": 0}
    response = http.post("/v1/chat/completions", json={**body, "n": None, "stream": None, "logprobs": None})
    assert response.status_code == 200, response.text
    out = response.json()
    assert len(out["choices"]) == 1 and out["choices"][0]["logprobs"] is None and out["object"] == "chat.completion"


def test_the_openai_client_sending_null_is_served(client):
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, n=None, logprobs=None,
                                         stream=None, top_logprobs=None, seed=None)
    assert len(out.choices) == 1


def test_a_null_prompt_is_a_400_saying_it_is_required(http):
    message = error_of(http.post("/v1/completions", json={"model": MODEL, "prompt": None, "max_tokens": 2}), "prompt")
    assert message.startswith("prompt is required"), message


# ---- 2. a text part without a string "text" ---------------------------------------------------------------

@pytest.mark.parametrize("part,got", [({"type": "text"}, "got no text"), ({"type": "text", "text": 5},
                                                                             "got text of type integer")])
def test_a_text_part_without_text_says_so(http, part, got):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}]
    message = error_of(http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2}),
                       "messages[0].content[1]")
    assert message == f'messages[0].content[1]: a text part needs a string "text", {got}', message


def test_a_non_text_part_still_names_its_type(http):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    message = error_of(http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2}),
                       "messages[0].content[0]")
    assert "only text parts are supported, got type 'image_url'" in message


# ---- 4. truncate_prompt_tokens keeps the prompt's last tokens, before the length check ---------------------

LONG_IDS = [(17 + 31 * i) % 4000 + 100 for i in range(9001)]


def test_completion_token_prompt_keeps_its_last_tokens(client):
    out = client.completions.create(model=MODEL, prompt=LONG_IDS, max_tokens=4, temperature=0,
                                    extra_body={"truncate_prompt_tokens": 100})
    assert out.usage.prompt_tokens == 100
    tail = client.completions.create(model=MODEL, prompt=LONG_IDS[-100:], max_tokens=4, temperature=0)
    assert out.choices[0].text == tail.choices[0].text  # the model saw exactly the last 100 tokens


def test_completion_text_prompt_is_truncated_not_refused(client):
    prompt = "hello " * 9000  # 9001 tokens with BOS: refused without truncation
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                    extra_body={"truncate_prompt_tokens": 100})
    assert out.usage.prompt_tokens == 100


def test_chat_prompt_is_truncated(client):
    messages = [{"role": "user", "content": "Tell me more. " * 2000}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                         extra_body={"truncate_prompt_tokens": 50})
    assert out.usage.prompt_tokens == 50


def test_truncate_minus_one_is_max_model_len(http):
    # -1 keeps max_model_len tokens, which leaves no room for output: the length check still runs after it.
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": LONG_IDS, "max_tokens": 2,
                                                  "truncate_prompt_tokens": -1})
    assert f"the prompt has {MAX_MODEL_LEN} tokens" in error_of(response, "prompt")
    short = http.post("/v1/completions", json={"model": MODEL, "prompt": LONG_IDS[:10], "max_tokens": 2,
                                               "truncate_prompt_tokens": -1})
    assert short.status_code == 200 and short.json()["usage"]["prompt_tokens"] == 10  # shorter: kept whole


@pytest.mark.parametrize("path,value,needle", [
    ("/v1/completions", 0, "truncate_prompt_tokens must be at least 1, or -1"),
    ("/v1/completions", -2, "truncate_prompt_tokens must be at least 1, or -1"),
    ("/v1/completions", MAX_MODEL_LEN + 1, f"truncate_prompt_tokens {MAX_MODEL_LEN + 1} is greater than this "
                                           f"model's maximum context length ({MAX_MODEL_LEN} tokens)"),
    ("/v1/chat/completions", 0, "truncate_prompt_tokens must be at least 1, or -1"),
    ("/v1/chat/completions", 10**6, "is greater than this model's maximum context length"),
])
def test_bad_truncate_prompt_tokens_is_a_400(http, path, value, needle):
    base = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": QUESTION}
    response = http.post(path, json={"model": MODEL, **base, "max_tokens": 2, "truncate_prompt_tokens": value,
                                     "stream": True})  # refused before a stream starts
    assert needle in error_of(response, "truncate_prompt_tokens")


# ---- 4b. vLLM's request_id names the response ------------------------------------------------------------

def test_request_id_names_the_response(client, http):
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                          extra_body={"request_id": "trace-42"})
    assert chat.id == "chatcmpl-trace-42"
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, stream=True,
                                                 extra_body={"request_id": "trace-42"}))
    assert {c.id for c in chunks} == {"chatcmpl-trace-42"}
    out = client.completions.create(model=MODEL, prompt=["Hi", "Yo"], max_tokens=2, extra_body={"request_id": "r1"})
    assert out.id == "cmpl-r1" and len(out.choices) == 2
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).id.startswith("cmpl-")
    for bad in ("", "a\nb"):
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "request_id": bad})
        error_of(response, "request_id")


def test_one_request_id_on_concurrent_requests_does_not_collide(server):
    from concurrent.futures import ThreadPoolExecutor

    def ask(_):
        return httpx.post(server.url("/v1/completions"), timeout=120,
                          json={"model": MODEL, "prompt": "Hello", "max_tokens": 8, "request_id": "same"})

    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(ask, range(3)))
    assert [r.status_code for r in responses] == [200] * 3, [r.text for r in responses]
    assert {r.json()["id"] for r in responses} == {"cmpl-same"}


# ---- 5. several --served-model-name names ----------------------------------------------------------------

def test_every_served_name_is_listed_and_accepted(client):
    assert [m.id for m in client.models.list().data] == [MODEL, ALIAS]
    assert client.models.retrieve(ALIAS).id == ALIAS
    out = client.completions.create(model=ALIAS, prompt="Hi", max_tokens=2)
    assert out.model == MODEL  # responses carry the first name, as vLLM's
    chat = client.chat.completions.create(model=ALIAS, messages=QUESTION, max_tokens=2)
    assert chat.model == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="other", prompt="Hi", max_tokens=2)
    assert f"this server serves '{MODEL}', '{ALIAS}'" in info.value.body["message"]


# ---- 7. best_of below n ----------------------------------------------------------------------------------

def test_best_of_below_n_is_the_openai_error(http):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    message = error_of(http.post("/v1/completions", json={**body, "best_of": 1, "n": 2}), "best_of")
    assert message.startswith("best_of must be greater than or equal to n"), message
    more = http.post("/v1/completions", json={**body, "best_of": 3, "n": 2})
    assert "is not supported yet" in error_of(more, "best_of")
    assert http.post("/v1/completions", json={**body, "best_of": 2, "n": 2}).status_code == 200


# ---- 8. vLLM's removed guided_* fields are refused, not ignored -------------------------------------------

@pytest.mark.parametrize("field,value,instead", [
    ("guided_json", {"type": "object"}, 'structured_outputs {"json": <schema>} or response_format'),
    ("guided_choice", ["yes", "no"], 'structured_outputs {"choice": [<strings>]}'),
    ("guided_regex", "[a-z]+", 'structured_outputs {"regex": <pattern>}'),
    ("guided_grammar", 'root ::= "a"', 'structured_outputs {"grammar": <EBNF grammar>}'),
])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_guided_fields_are_a_400_pointing_to_structured_outputs(http, path, field, value, instead):
    base = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": QUESTION}
    message = error_of(http.post(path, json={"model": MODEL, **base, "max_tokens": 2, field: value}), field)
    assert message.startswith(f"{field} is not supported") and instead in message, message


def test_a_null_guided_field_asks_nothing_and_is_served(http):
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2,
                                                  "guided_json": None})
    assert response.status_code == 200, response.text


def test_structured_outputs_still_constrains(http):
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": "Answer yes or no:", "max_tokens": 4,
                                                  "structured_outputs": {"choice": ["yes", "no"]}})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] in ("yes", "no")


def test_the_server_still_serves(client, http):
    assert client.completions.create(model=MODEL, prompt="Hello", max_tokens=2).choices[0].finish_reason
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [MODEL, ALIAS]


# ---- vLLM's return_token_ids on chat ----------------------------------------------------------------------

def test_chat_return_token_ids_full_and_streamed(http):
    """The response carries the rendered prompt's ids (as /tokenize gives them) and each choice its generated ids,
    which decode to its text; streamed, the first chunk has the prompt's ids and the chunks' ids join to the same."""
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    out = http.post("/v1/chat/completions", json=body).json()
    prompt = http.post("/tokenize", json={"model": MODEL, "messages": QUESTION}).json()["tokens"]
    ids = out["choices"][0]["token_ids"]
    assert out["prompt_token_ids"] == prompt and len(ids) == out["usage"]["completion_tokens"]
    text = http.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    assert text == out["choices"][0]["message"]["content"]
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(e) for e in events]
    assert chunks[0]["prompt_token_ids"] == prompt and all(c["prompt_token_ids"] is None for c in chunks[1:])
    assert [t for c in chunks for choice in c["choices"] for t in (choice["token_ids"] or [])] == ids
    plain = http.post("/v1/chat/completions", json={**body, "return_token_ids": None}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]  # the body without the option
    with http.stream("POST", "/v1/chat/completions", json={**body, "return_token_ids": False, "stream": True}) as r:
        plain_chunks = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines()
                        if line.startswith("data: {")]
    assert not any("prompt_token_ids" in c or any("token_ids" in ch for ch in c["choices"]) for c in plain_chunks)
