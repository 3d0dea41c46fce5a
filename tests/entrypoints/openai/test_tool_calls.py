"""Tool calling logic without a model: tools validation, the grammar that forces calls, the parser of free
answers, the streaming hold-back, and the conversation given to a template that knows no tools."""

from __future__ import annotations

import json

import jsonschema
import pytest

from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.tool_calls import ToolStream, make_tool_plan, parse_tool_calls, prepare_conversation

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
TOOLS = [WEATHER, TIME]


def plan(choice="auto", tools=TOOLS, parallel=None, other=False):
    return make_tool_plan(tools, choice, parallel, other_constraint=other)


@pytest.mark.parametrize("tools,choice,other,param,fragment", [
    ([{"type": "function"}], "auto", False, "tools", "tools[0]"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "auto", False, "tools", "letters"),
    ([WEATHER, WEATHER], "auto", False, "tools", "two functions"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}], "auto", False, "tools",
     "Unsupported type"),
    (TOOLS, {"type": "function", "function": {"name": "missing"}}, False, "tool_choice", "not in tools"),
    (None, "required", False, "tool_choice", "no tools"),
    (TOOLS, "required", True, "tool_choice", "cannot be combined"),
    (TOOLS, "sometimes", False, "tool_choice", "sometimes"),
    (TOOLS, {"type": "function"}, False, "tool_choice", "tool_choice must be"),
])
def test_bad_tools_are_400_naming_the_field(tools, choice, other, param, fragment):
    with pytest.raises(OpenAIError) as info:
        make_tool_plan(tools, choice, None, other_constraint=other)
    assert info.value.status_code == 400 and info.value.param == param and fragment in info.value.message


def test_modes_and_their_constraints():
    assert plan(tools=None).mode == "none" and not plan(tools=None).active
    assert plan("none").constraint() is None and plan("auto").constraint() is None
    named = plan({"type": "function", "function": {"name": "get_time"}})
    assert named.mode == "named" and named.constraint().json == TIME["function"]["parameters"]
    schema = plan("required").constraint().json
    good = [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz": "UTC"}}]
    jsonschema.validate(good, schema)
    for bad in ([], [{"name": "get_time", "arguments": {"city": "Paris"}}], [{"name": "other", "arguments": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = plan("required", parallel=False).constraint().json
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, single)


def test_parser_reads_hermes_blocks_and_bare_json():
    tools = plan().tools
    text = 'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    content, calls = parse_tool_calls(text, tools)
    assert content == "Let me check." and len(calls) == 1
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert calls[0].id.startswith("call_")
    two = ('<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>'
           '<tool_call>{"name": "get_weather", "parameters": {"city": "Rome"}}')  # unclosed last block
    content, calls = parse_tool_calls(two, tools)
    assert content is None and [c.function.name for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[0].function.arguments) == {"tz": "UTC"}
    content, calls = parse_tool_calls(' [{"name": "get_time", "arguments": {"tz": "CET"}}]', tools)
    assert content is None and calls[0].function.name == "get_time"


@pytest.mark.parametrize("text", [
    "Paris is sunny today.",
    '{"name": "unknown_tool", "arguments": {}}',
    '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
    '{"city": "Paris"}',
])
def test_parser_leaves_everything_else_as_content(text):
    assert parse_tool_calls(text, plan().tools) == (text, [])


def test_auto_stream_holds_back_only_what_may_be_a_call():
    stream = ToolStream(plan())
    pieces = ["Sure", ", checking", " <tool", "_call>", '{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}',
              "</tool_call>"]
    sent = "".join(stream.feed(p).content or "" for p in pieces)
    assert sent == "Sure, checking "
    last, reason = stream.finish("stop")
    assert reason == "tool_calls" and not last.content
    assert last.tool_calls[0].index == 0 and last.tool_calls[0].function.name == "get_weather"
    plain = ToolStream(plan())
    assert "".join(plain.feed(p).content or "" for p in ["It is ", "<b>", "warm"]) == "It is <b>warm"
    assert plain.finish("length") == (plain.finish("length")[0], "length")
    json_like = ToolStream(plan())
    assert json_like.feed('{"city": "Paris"}').content is None  # may be a call until the end
    last, reason = json_like.finish("stop")
    assert last.content == '{"city": "Paris"}' and last.tool_calls is None and reason == "stop"


def test_named_stream_sends_header_then_arguments():
    stream = ToolStream(plan({"type": "function", "function": {"name": "get_time"}}))
    first, second = stream.feed('{"tz"'), stream.feed(': "UTC"}')
    assert first.tool_calls[0].id == stream.call_id and first.tool_calls[0].function.name == "get_time"
    assert second.tool_calls[0].id is None and second.tool_calls[0].function.arguments == ': "UTC"}'
    assert stream.feed("").tool_calls is None
    last, reason = stream.finish("stop")
    assert last.tool_calls is None and reason == "stop"  # a forced named function stops, as OpenAI and vLLM say


@pytest.mark.parametrize("choice,reason", [
    ({"type": "function", "function": {"name": "get_time"}}, "stop"),  # forced: OpenAI and vLLM say "stop"
    ("required", "tool_calls"),
    ("auto", "tool_calls"),  # the model chose to call
])
def test_finish_reason_of_a_choice_that_made_calls(choice, reason):
    from brigade.entrypoints.openai.serving_chat import OpenAIServingChat

    text = '{"tz": "UTC"}' if isinstance(choice, dict) else '[{"name": "get_time", "arguments": {"tz": "UTC"}}]'
    message, finish_reason = OpenAIServingChat._message(text, "stop", plan(choice))
    assert message.tool_calls and finish_reason == reason
    stream = ToolStream(plan(choice))
    stream.feed(text)
    assert stream.finish("stop")[1] == reason
    assert OpenAIServingChat._message(text, "length", plan(choice))[1] == "length"  # cut off: length either way


def test_required_stream_sends_whole_calls_at_the_end():
    stream = ToolStream(plan("required"))
    text = '[{"name": "get_time", "arguments": {"tz": "UTC"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]'
    assert stream.feed(text[:20]).content is None and stream.feed(text[20:]).tool_calls is None
    last, reason = stream.finish("stop")
    assert reason == "tool_calls" and [c.index for c in last.tool_calls] == [0, 1]
    truncated = ToolStream(plan("required"))
    truncated.feed(text[:30])
    last, reason = truncated.finish("length")
    assert last.content == text[:30] and reason == "length"  # nothing parsable: the text is returned


def test_required_answer_cut_off_keeps_its_complete_calls():
    """A small model may repeat its call until max_tokens ends it inside the array: the whole calls count."""
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    cut = "[" + ", ".join([call] * 3) + ', {"name": "get_wea'
    calls = plan("required").calls_from_output(cut)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})] * 3
    stream = ToolStream(plan("required"))
    stream.feed(cut)
    last, reason = stream.finish("length")
    assert len(last.tool_calls) == 3 and last.content is None and reason == "length"
    for text in ('[{"name": "get_wea', "[", "", '[{"name": "nope", "arguments": {}}, '):  # nothing whole and known
        assert plan("required").calls_from_output(text) is None
    assert plan("auto").calls_from_output(cut) is None  # only forced arrays are salvaged


def test_conversation_for_a_template_without_tools():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    out = prepare_conversation(messages, plan(), template_knows_tools=False)
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2]["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert "tool_calls" not in out[2] and messages[1]["tool_calls"]  # the input is not modified
    with_system = prepare_conversation([{"role": "system", "content": "Be brief."}, *messages], plan(), False)
    assert with_system[0]["content"].startswith("Be brief.\n\n") and len(with_system) == 4
    assert prepare_conversation(messages, plan(), template_knows_tools=True) is messages
