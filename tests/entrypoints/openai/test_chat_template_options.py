"""The chat template's options over real HTTP (/v1/chat/completions and /tokenize): ``chat_template_kwargs`` set
template variables but may not replace the template call's own arguments, a request's own ``chat_template`` is
refused, and ``continue_final_message`` with ``add_generation_prompt`` is vLLM's 400. Every refusal is a 400
invalid_request_error in OpenAI's shape naming the field."""

from __future__ import annotations

import pytest
from remote_server import error_of
from shared_server import CONTINUED, MODEL, QUESTION, assert_400, chat_body, tokenize


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


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
def test_a_request_chat_template_is_refused(http, route):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    body = chat_body(chat_template=template) if route != "/tokenize" else \
        {"model": MODEL, "messages": QUESTION, "chat_template": template}
    error = assert_400(http.post(route, json=body), "chat_template")
    assert "--chat-template" in error["message"], error
    accepted = http.post(route, json={**body, "chat_template": None})
    assert accepted.status_code == 200, accepted.text


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
def test_continue_final_message_with_add_generation_prompt_is_vllms_400(http, route):
    body = {"model": MODEL, "messages": CONTINUED, "max_tokens": 1}
    error = error_of(http.post(route, json={**body, "continue_final_message": True, "add_generation_prompt": True}),
                     400)
    assert error["message"] == "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", error
    assert error["type"] == "invalid_request_error" and error["param"] == "continue_final_message", error
    # As in vLLM, only what the client sent counts: continue_final_message alone continues the message.
    for fields in ({"continue_final_message": True}, {"continue_final_message": True, "add_generation_prompt": False}):
        assert http.post(route, json={**body, **fields}).status_code == 200
