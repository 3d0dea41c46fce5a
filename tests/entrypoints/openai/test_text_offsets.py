"""Completions' ``logprobs.text_offset`` when tokens split a character: non-decreasing, inside the text, each
whole token where it says; with ``echo`` it continues after the prompt; streamed offsets equal the full ones
even when a long stop string cuts the text."""

from __future__ import annotations

import json

import httpx
import pytest
from shared_server import MODEL


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
