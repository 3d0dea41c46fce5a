"""Pydantic's refusals of a request body read as one sentence about the field, as the client wrote it: a
field whose union members all refused names the members, nested locations use ``messages[0].content``."""

import pytest
from pydantic import ValidationError

from brigade.entrypoints.openai.errors import from_validation_error
from brigade.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, parse_json_body
from brigade.sampling_params import InvalidParamError


def _error(cls, body):
    with pytest.raises(ValidationError) as info:
        cls(**body)
    return from_validation_error(info.value)


@pytest.mark.parametrize("cls,body,param,message", [
    (CompletionRequest, {"prompt": "x", "stop": 42}, "stop", "stop: must be str or list[str], got 42"),
    (CompletionRequest, {"prompt": "x", "stop": {"a": 1}}, "stop", "stop: must be str or list[str]"),
    (CompletionRequest, {"prompt": 3}, "prompt",
     "prompt: must be str or list[str] or list[int] or list[list[int]], got 3"),
    (CompletionRequest, {"prompt": "x", "max_tokens": "a"}, "max_tokens",
     "max_tokens: Input should be a valid integer, got 'a'"),
    (ChatCompletionRequest, {"messages": [{"role": "wizard", "content": "x"}]}, "messages",
     "messages[0].role: Input should be 'system', 'developer', 'user', 'assistant', 'tool' or 'function', "
     "got 'wizard'"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": 3}]}, "messages",
     "messages[0].content: must be str or list[dict[str,any]], got 3"),
    (CompletionRequest, {"prompt": "x", "priority": 2**80}, "priority",
     f"priority: Input should be less than or equal to {2**63 - 1}, got {2**80}"),  # the fuzzer's 500, once
    (CompletionRequest, {"prompt": [[1, 2**70]]}, "prompt",
     f"prompt[0][1]: Input should be less than or equal to {2**63 - 1}, got {2**70}"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": 3}, {"role": "user", "content": 4}]},
     "messages", "messages[0].content: must be str or list[dict[str,any]], got 3 (and 2 more)"),
])
def test_refusals_name_the_field_as_the_client_wrote_it(cls, body, param, message):
    error = _error(cls, body)
    assert error.status_code == 400 and error.param == param
    assert error.message == message


@pytest.mark.parametrize("body,message", [
    (b'\xff\xfe{\x00}\x00', "the request body is not UTF-8 text (byte 0 is invalid); send UTF-8 JSON"),
    (b'{"prompt": "\xc3\x28"}', "the request body is not UTF-8 text (byte 12 is invalid); send UTF-8 JSON"),
    (b'{"prompt": ', "the request body is not valid JSON: Expecting value: line 1 column 12 (char 11)"),
])
def test_a_body_that_is_not_utf8_json_says_which(body, message):
    with pytest.raises(InvalidParamError) as info:
        parse_json_body(body)
    assert str(info.value) == message and info.value.param is None


def test_utf8_with_a_byte_order_mark_is_read():
    assert parse_json_body(b'\xef\xbb\xbf{"prompt": "\xc3\xa9"}') == {"prompt": "\u00e9"}


# ---- null for every field OpenAI declares nullable -------------------------------------------------------

def _openai_nullable_fields(*param_classes) -> set[str]:
    """The fields the official openai client's request types declare ``Optional`` (OpenAI's spec: null allowed)."""
    import typing

    out = set()
    for cls in param_classes:
        for name, hint in typing.get_type_hints(cls, include_extras=True).items():
            while typing.get_origin(hint) in (typing.Required, typing.NotRequired, typing.Annotated):
                hint = typing.get_args(hint)[0]
            if type(None) in typing.get_args(hint):
                out.add(name)
    return out


@pytest.mark.parametrize("cls,required,params", [
    (CompletionRequest, {"prompt": "x"}, ("completion_create_params", "CompletionCreateParamsNonStreaming")),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}]},
     ("chat.completion_create_params", "CompletionCreateParamsNonStreaming")),
])
def test_every_field_openai_declares_nullable_takes_null_as_its_default(cls, required, params):
    import importlib

    module = importlib.import_module(f"openai.types.{params[0]}")
    nullable = _openai_nullable_fields(getattr(module, params[1]))
    assert {"n", "stream", "temperature", "stop"} <= nullable  # the client's types were read
    nullable -= set(required) | {"prompt"}  # prompt: null is a 400 saying it is required (serving_completion)
    request = cls(**required, **{name: None for name in nullable})  # accepted, not "should be a valid integer"
    for name in nullable & set(cls.model_fields):
        # None where None is the field's meaning of "not given" (temperature: generation_config's; completions'
        # max_tokens: up to the context, as vLLM), else the field's default.
        assert getattr(request, name) in (None, cls.model_fields[name].get_default(call_default_factory=True)), name
    assert (request.n, request.stream) == (1, False)
    if cls is CompletionRequest:
        assert request.echo is False and cls(prompt=None).prompt is None
    else:
        assert request.logprobs is False


@pytest.mark.parametrize("part,message", [
    ({"type": "text"}, 'messages[0].content[1]: a text part needs a string "text", got no text'),
    ({"type": "text", "text": None},
     'messages[0].content[1]: a text part needs a string "text", got text of type null'),
    ({"type": "text", "text": ["a"]}, 'messages[0].content[1]: a text part needs a string "text", got text of type '
                                      'array'),
    ({"type": "input_audio"}, "messages[0].content[1]: only text parts are supported, got type 'input_audio'"),
])
def test_a_bad_content_part_names_the_part(part, message):
    request = ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, part]}])
    with pytest.raises(InvalidParamError) as info:
        request.messages[0].to_template_dict(0)
    assert str(info.value) == message and info.value.param == "messages[0].content[1]"
