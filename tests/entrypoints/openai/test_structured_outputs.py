"""End to end: structured outputs and tool calls on a real ``brigade serve`` (SmolLM2, CPU) with the openai client.

Every constrained output is checked with ``jsonschema`` (or the regex / choice / grammar it must match),
for n > 1 and for streams, since the grammar must hold for each sequence and each chunking. The requests only
read the server: they go to the folder's shared one (``server`` and ``client`` of conftest.py); outputs are short
so the CPU keeps up.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from shared_server import MODEL

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]},
                   "temperature_c": {"type": "integer", "minimum": -40, "maximum": 50},
                   "sunny": {"type": "boolean"}},
    "required": ["city", "temperature_c", "sunny"], "additionalProperties": False}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris today? Answer in JSON."}]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert", "description": "Convert an amount between currencies",
        "parameters": {"type": "object", "properties": {"amount": {"type": "integer", "minimum": 0, "maximum": 999},
                                                        "to": {"type": "string", "enum": ["EUR", "USD"]}},
                       "required": ["amount", "to"], "additionalProperties": False}}},
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_calls(tool_calls, allowed=PARAMETERS):
    """Every call names a tool and its arguments validate against that tool's parameters schema."""
    assert tool_calls
    for call in tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), allowed[call.function.name])


# ---- response_format ---------------------------------------------------------------------------------

def test_json_schema_stream_n2_every_choice_valid(client):
    chunks = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, n=2, temperature=1.0, seed=11, max_completion_tokens=60, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA,
                                                                "strict": True}})
    texts, reasons = {0: "", 1: ""}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert reasons == {0: "stop", 1: "stop"}
    for text in texts.values():
        jsonschema.validate(json.loads(text), WEATHER_SCHEMA)


def test_json_object(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": 'What is the capital of Italy? Answer as a JSON object '
                                                           'with the key "capital".'}],
        temperature=0, max_completion_tokens=40, response_format={"type": "json_object"})
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


# ---- structured_outputs (vLLM's extra field) -----------------------------------------------------------

@pytest.mark.parametrize("constraint,check,n", [
    ({"regex": r"[A-Z][a-z]{2,8}, [0-9]{4}"}, lambda t: re.fullmatch(r"[A-Z][a-z]{2,8}, [0-9]{4}", t), 1),
    ({"choice": ["Paris", "Lyon", "Nice"]}, lambda t: t in ("Paris", "Lyon", "Nice"), 2),
    ({"grammar": 'root ::= "The answer is " ("yes" | "no") "."'},
     lambda t: t in ("The answer is yes.", "The answer is no."), 1),
    ({"json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
               "maxItems": 3}}, lambda t: jsonschema.validate(json.loads(t), {
                   "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
                   "maxItems": 3}) is None, 1),
])
def test_structured_outputs_on_completions(client, constraint, check, n):
    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=30, temperature=0.8,
                                    seed=5, n=n, extra_body={"structured_outputs": constraint})
    assert len(out.choices) == n
    for choice in out.choices:
        assert choice.finish_reason == "stop" and check(choice.text), choice.text


def test_structured_outputs_stream_on_completions(client):
    constraint = {"structured_outputs": {"choice": ["Rome", "Oslo"]}}
    chunks = list(client.completions.create(model=MODEL, prompt="Name a city:", max_tokens=20, temperature=0,
                                            stream=True, extra_body=constraint))
    assert "".join(c.choices[0].text for c in chunks) in ("Rome", "Oslo")
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"structured_outputs": {"json": {"type": "object", "properties": 3}}}, "structured_outputs"),
    ("/v1/completions", {"structured_outputs": {"grammar": "root ::= missing"}}, "structured_outputs"),
    ("/v1/completions", {"structured_outputs": {"choice": []}}, "structured_outputs"),
    ("/v1/completions", {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "response_format"),
    ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strange"}}}}}]}, "tools"),
])
def test_bad_constraint_is_400_before_queuing(server, path, body, param):
    base = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": ASK_WEATHER}
    response = httpx.post(server.url(path), json={**base, "max_tokens": 4, "stream": True, **body}, timeout=60)
    assert response.status_code == 400, response.text  # even a stream is refused before it starts
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


# ---- tools ---------------------------------------------------------------------------------------------

def test_tool_choice_required_n2(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "How warm is it in Rome?"}], tools=TOOLS,
        tool_choice="required", parallel_tool_calls=False, n=2, temperature=1.0, seed=3, max_completion_tokens=50)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        check_calls(choice.message.tool_calls)


def test_tool_choice_required_stream(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "How warm is it in Rome?"}], tools=TOOLS,
        tool_choice="required", temperature=0, max_completion_tokens=80, stream=True, parallel_tool_calls=False))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and len(calls) == 1  # parallel_tool_calls=False
    assert calls[0].index == 0 and calls[0].id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS[calls[0].function.name])


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice(client, stream):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Convert 20 dollars to euros."}], tools=TOOLS,
                  tool_choice={"type": "function", "function": {"name": "convert"}}, temperature=0,
                  max_completion_tokens=40)
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        assert choice.finish_reason == "stop"  # a forced named function: "stop", as OpenAI and vLLM say
        check_calls(choice.message.tool_calls, {"convert": PARAMETERS["convert"]})
        return
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    pieces = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert pieces[0].id.startswith("call_") and pieces[0].function.name == "convert"
    assert all(p.index == 0 and p.id is None for p in pieces[1:])  # later pieces only add arguments
    arguments = "".join(p.function.arguments or "" for p in pieces)
    jsonschema.validate(json.loads(arguments), PARAMETERS["convert"])
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_parses_a_call(client, stream):
    # The model chooses freely under "auto"; a response_format that spells a call makes the answer one, so
    # the parser (not the grammar) is what turns it into tool_calls here.
    call_schema = {"type": "object", "properties": {"name": {"const": "get_weather"},
                                                    "arguments": PARAMETERS["get_weather"]},
                   "required": ["name", "arguments"], "additionalProperties": False}
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=TOOLS,
                  tool_choice="auto", temperature=0, max_completion_tokens=40,
                  response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": call_schema}})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert all(not (c.choices and c.choices[0].delta.content) for c in chunks)  # held back, then parsed
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        reason = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls, reason = choice.message.tool_calls, choice.finish_reason
        assert choice.message.content is None
    assert reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]
    check_calls(calls)


def test_auto_without_a_call_is_plain_content(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS, temperature=0,
        max_completion_tokens=8)
    choice = out.choices[0]
    assert choice.message.content and not choice.message.tool_calls and choice.finish_reason in ("stop", "length")


def test_tool_result_turn_renders_and_answers(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21, "sunny": true}'}]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                         temperature=0, max_completion_tokens=6)
    assert out.choices[0].message.content and out.choices[0].finish_reason == "length"
