"""A real ``brigade serve --skip-tokenizer-init`` on SmolLM2: token-id prompts stream, score and echo without text.

With no tokenizer the server returns no text, as vLLM does: ``text`` is "", logprobs name tokens ``token_id:N`` and
every ``text_offset`` is 0. What truly needs text (a text prompt, stop strings, bad words, chat messages,
/tokenize, /detokenize) is a 400 that says so. ``brigade bench serve`` (the GPU benchmark's set-up) runs whole
against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import openai
import pytest

from remote_server import RemoteServer

MODEL = "smollm2-ids"
PROMPT = [504, 3458, 282, 4649, 314]  # token ids only: this server cannot read text
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--skip-tokenizer-init", "--served-model-name", MODEL, "--max-model-len", "256",
                                      "--num-gpu-blocks-override", "64", "--block-size", "16", "--max-num-seqs", "8"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


def complete(client, **kwargs):
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, **kwargs)


def check_ids_only(logprobs, token_ids: list[int], num_top: int) -> None:
    """Logprobs of a response without text: tokens named by id, all offsets 0, each token among its top."""
    assert logprobs.tokens == [f"token_id:{t}" for t in token_ids]
    assert logprobs.text_offset == [0] * len(token_ids)
    for token, top, lp in zip(logprobs.tokens, logprobs.top_logprobs, logprobs.token_logprobs):
        if top is None:  # an echoed prompt's first token: nothing to score it against
            assert lp is None
            continue
        assert token in top and top[token] == lp and len(top) <= num_top + 1
        assert all(name.startswith("token_id:") for name in top)


def generated_ids(logprobs) -> list[int]:
    return [int(token.removeprefix("token_id:")) for token in logprobs.tokens]


def test_full_completion_with_logprobs_names_tokens_by_id(client):
    response = complete(client, logprobs=2)
    choice = response.choices[0]
    assert choice.text == "" and choice.finish_reason == "length"
    assert response.usage.completion_tokens == MAX_TOKENS and response.usage.prompt_tokens == len(PROMPT)
    assert len(choice.logprobs.tokens) == MAX_TOKENS
    check_ids_only(choice.logprobs, generated_ids(choice.logprobs), 2)


def test_echo_scores_the_prompt_tokens(client):
    """echo with logprobs (lm-eval's loglikelihood, max_tokens 0 included): the prompt's ids come back scored."""
    scored = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == "" and scored.usage.completion_tokens == 0
    check_ids_only(choice.logprobs, PROMPT, 1)
    assert choice.logprobs.token_logprobs[0] is None and all(lp < 0 for lp in choice.logprobs.token_logprobs[1:])

    full = complete(client, echo=True, logprobs=1)
    logprobs = full.choices[0].logprobs
    assert logprobs.tokens[:len(PROMPT)] == choice.logprobs.tokens
    assert logprobs.token_logprobs[1:len(PROMPT)] == pytest.approx(choice.logprobs.token_logprobs[1:], abs=1e-4)
    check_ids_only(logprobs, [*PROMPT, *generated_ids(logprobs)[len(PROMPT):]], 1)


def test_stream_matches_the_full_response(client):
    """Each generated token's logprob entry goes out with its own chunk (no text is coming to carry it); the
    first chunk echoes the prompt's entries; together they equal the full response's."""
    full = complete(client, echo=True, logprobs=1).choices[0].logprobs
    chunks = list(complete(client, echo=True, logprobs=1, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == MAX_TOKENS and not chunks[-1].choices
    choices = [c.choices[0] for c in chunks if c.choices]
    assert all(c.text == "" for c in choices) and choices[-1].finish_reason == "length"
    assert len(choices[0].logprobs.tokens) == len(PROMPT) + 1  # the echoed prompt, then the first token
    assert [len(c.logprobs.tokens) for c in choices[1:]] == [1] * (MAX_TOKENS - 1)
    tokens = [t for c in choices for t in c.logprobs.tokens]
    offsets = [o for c in choices for o in c.logprobs.text_offset]
    assert tokens == full.tokens and offsets == full.text_offset
    assert [lp for c in choices for lp in c.logprobs.token_logprobs][1:] == pytest.approx(full.token_logprobs[1:],
                                                                                          abs=1e-4)


def test_stream_without_logprobs_carries_one_chunk_per_token(client):
    chunks = list(complete(client, stream=True, stream_options={"include_usage": True}))
    choices = [c.choices[0] for c in chunks if c.choices]
    assert len(choices) == MAX_TOKENS and all(c.text == "" and c.logprobs is None for c in choices)
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_return_token_ids_gives_the_generated_ids_full_and_streamed(client):
    """vLLM's ``return_token_ids``: the only way a token-id client reads the output of a server without text."""
    full = complete(client, logprobs=1, extra_body={"return_token_ids": True}).choices[0]
    assert full.prompt_token_ids == PROMPT and full.token_ids == generated_ids(full.logprobs)
    assert len(full.token_ids) == MAX_TOKENS
    chunks = [c.choices[0] for c in complete(client, stream=True, extra_body={"return_token_ids": True})
              if c.choices]
    assert chunks[0].prompt_token_ids == PROMPT and all(c.prompt_token_ids is None for c in chunks[1:])
    assert [t for c in chunks for t in c.token_ids] == full.token_ids  # greedy: the same tokens
    plain = complete(client).choices[0]  # the body without the option: neither field
    assert "token_ids" not in plain.model_dump() and "prompt_token_ids" not in plain.model_dump()
    streamed = [c.choices[0].model_dump() for c in complete(client, stream=True) if c.choices]
    assert not any("token_ids" in c or "prompt_token_ids" in c for c in streamed)


@pytest.mark.parametrize("field, kwargs", [
    ("prompt", {"prompt": "Hello"}),
    ("stop", {"stop": ["."]}),
    ("bad_words", {"extra_body": {"bad_words": ["the"]}}),
])
def test_fields_that_need_text_are_refused(client, field, kwargs):
    request = {"prompt": PROMPT, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, max_tokens=MAX_TOKENS, **request)
    error = info.value.body
    assert error["param"] == field and "--skip-tokenizer-init" in error["message"], error


def test_routes_that_need_text_are_refused(client, server):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert info.value.body["param"] == "messages" and "--skip-tokenizer-init" in info.value.body["message"]
    for path, body, param in (("/tokenize", {"prompt": "Hi"}, "prompt"), ("/detokenize", {"tokens": PROMPT}, "tokens")):
        response = httpx.post(server.url(path), json=body, timeout=30)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and "--skip-tokenizer-init" in error["message"]


def test_bench_serve_runs_against_it(server, smollm2_path, tmp_path):
    """``brigade bench serve`` with token-id prompts, the headline serving benchmark's set-up, a few prompts."""
    out = tmp_path / "serve.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "brigade.entrypoints.cli.main", "bench", "serve", str(smollm2_path),
                           "--skip-tokenizer-init", "--served-model-name", MODEL, "--base-url", server.base_url,
                           "--dataset", "random", "--num-prompts", "4", "--input-len", "16", "--output-len", "6",
                           "--output-json", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    metrics = json.loads(out.read_text())["results"]["brigade"]
    assert (metrics["num_requests"], metrics["completed"], metrics["failed"], metrics["errors"]) == (4, 4, 0, [])
    assert (metrics["num_prompt_tokens"], metrics["num_output_tokens"]) == (4 * 16, 4 * 6)
    assert metrics["requests_per_s"] == pytest.approx(4 / metrics["duration_s"])
    assert metrics["output_tokens_per_s"] == pytest.approx(24 / metrics["duration_s"])
    for name in ("ttft_ms", "e2el_ms", "tpot_ms"):
        assert metrics[name]["count"] == 4 and 0 < metrics[name]["min"] <= metrics[name]["max"]
    assert metrics["ttft_ms"]["max"] < metrics["e2el_ms"]["max"] <= metrics["duration_s"] * 1000
    assert metrics["itl_ms"]["count"] == 4 * (6 - 1)
