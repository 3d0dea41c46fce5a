"""Prompts over the length limit: a huge one is refused from its length in characters before it is tokenized
(a small request is served meanwhile), one just over the limit still gets the exact token count."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from shared_server import MAX_MODEL_LEN, MODEL, assert_openai_400, assert_still_serving

HUGE = "a" * 8_000_000  # tokenizing this takes seconds on one CPU thread; the pre-check takes nothing


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
