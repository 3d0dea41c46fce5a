"""Completions' ``max_tokens`` at its edges: ``null`` is OpenAI's default, 16; 0 with ``echo`` scores the prompt
only (lm-eval's loglikelihood requests), counting no completion token; 0 without ``echo`` is refused."""

from __future__ import annotations

import json

import openai
import pytest
from shared_server import MODEL, assert_openai_400, completion


def test_completions_max_tokens_null_is_sixteen(http):
    out = http.post("/v1/completions", json=completion(max_tokens=None, ignore_eos=True))
    assert out.status_code == 200, out.text
    assert out.json()["usage"]["completion_tokens"] == 16
    assert out.json()["choices"][0]["finish_reason"] == "length"


def test_echo_with_max_tokens_zero_counts_no_completion_token(http):
    out = http.post("/v1/completions", json=completion(echo=True, max_tokens=0))
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["choices"][0]["text"] == "The capital of France is"
    usage = body["usage"]
    assert usage["completion_tokens"] == 0 and usage["total_tokens"] == usage["prompt_tokens"] > 0, usage
    with http.stream("POST", "/v1/completions",
                     json=completion(echo=True, max_tokens=0, stream=True,
                                     stream_options={"include_usage": True})) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[-1]["usage"] == usage


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
