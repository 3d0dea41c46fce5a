"""Overlapped (async) scheduling stays on while requests use penalties, bad words, min_tokens, prompt logprobs or a
grammar, and their outputs are the ones a step at a time gives (SmolLM2, fp32, CPU).

Under overlap the runner samples step N+1 before step N's token reaches the host: the penalties count that token
on the device, a bad word's match reads it there, min_tokens counts it, and prompt logprobs are placed by the
step's own plan; a request under a grammar sits out the steps planned while its token is in flight. Each request runs once with overlap and once without (the same engine), and each feature is
checked to change its request's output, so an equality that ignored it could not pass.
"""

from __future__ import annotations

import re

import pytest

from brigade.entrypoints.llm import LLM
from brigade.sampling_params import SamplingParams, StructuredOutputsParams

CHAT_YES = "<|im_start|>user\nAnswer with one word: is water wet?<|im_end|>\n<|im_start|>assistant\n"
# name -> (prompt, the feature's fields); each also runs without its fields as a baseline
REQUESTS = {
    "repetition_penalty": ("Repeat after me: apple apple apple apple", {"repetition_penalty": 1.8}),
    "presence_frequency": ("Fruits: apple, banana, apple, banana,", {"presence_penalty": 1.5,
                                                                    "frequency_penalty": 1.5}),
    "seeded_random_penalty": ("Once upon a time", {"temperature": 0.9, "seed": 7, "repetition_penalty": 1.3}),
    "bad_words": ("The capital of France is", {"bad_words": ["Paris."]}),
    "min_tokens": (CHAT_YES, {"min_tokens": 12}),
    "prompt_logprobs": ("The quick brown fox jumps over the lazy dog", {"prompt_logprobs": 2}),
    "grammar": (CHAT_YES, {"structured_outputs": StructuredOutputsParams(regex="[A-Z][a-z]+ [a-z]+ [a-z]+[.]")}),
}
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(str(smollm2_path), dtype="float32", max_model_len=256, async_scheduling=True,
               enable_prefix_caching=False, max_num_seqs=16)


def params(fields: dict) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": MAX_TOKENS, **fields})


def run(llm: LLM, overlap: bool, with_features: bool = True) -> dict:
    """Every request at once, stepped by hand; returns name -> final RequestOutput. Checks that the engine
    overlaps every step when ``overlap``, whatever features the requests use."""
    core = llm.engine.core
    core.overlap = overlap
    overlapped_steps = []
    step_overlapped = type(core)._step_overlapped
    core._step_overlapped = lambda: overlapped_steps.append(1) or step_overlapped(core)  # counts, then runs it
    for name, (prompt, fields) in REQUESTS.items():
        kept = fields if with_features else {k: v for k, v in fields.items() if k in ("temperature", "seed")}
        llm.engine.add_request(name, prompt, params(kept))
    finals = {}
    num_steps = 0
    while llm.engine.has_unfinished_requests():
        num_steps += 1
        for output in llm.engine.step():
            if output.finished:
                finals[output.request_id] = output
    del core._step_overlapped
    assert len(overlapped_steps) == (num_steps if overlap else 0), "a request turned overlapped scheduling off"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"
    return finals


def test_outputs_with_overlap_equal_those_without(llm):
    overlapped = run(llm, overlap=True)
    stepped = run(llm, overlap=False)
    baseline = run(llm, overlap=False, with_features=False)
    for name in REQUESTS:
        got, want = overlapped[name].outputs[0], stepped[name].outputs[0]
        assert got.token_ids == want.token_ids, f"{name}: overlap changed the output"
        assert got.finish_reason == want.finish_reason, name
        if name != "prompt_logprobs":  # each feature matters here, so equality above is a real check
            assert want.token_ids != baseline[name].outputs[0].token_ids, f"{name} did not change the output"
    assert "Paris." not in stepped["bad_words"].outputs[0].text
    assert " Paris" in stepped["bad_words"].outputs[0].text  # the word's first token is allowed; "." is not
    assert len(stepped["min_tokens"].outputs[0].token_ids) >= 12 > len(baseline["min_tokens"].outputs[0].token_ids)
    assert re.fullmatch("[A-Z][a-z]+ [a-z]+ [a-z]+[.]", overlapped["grammar"].outputs[0].text)
    rows, want_rows = overlapped["prompt_logprobs"].prompt_logprobs, stepped["prompt_logprobs"].prompt_logprobs
    assert len(rows) == len(overlapped["prompt_logprobs"].prompt_token_ids) and rows[0] is None
    for row, want_row in zip(rows[1:], want_rows[1:]):
        assert list(row) == list(want_row)
        assert [lp.logprob for lp in row.values()] == pytest.approx([lp.logprob for lp in want_row.values()],
                                                                    abs=1e-5)
