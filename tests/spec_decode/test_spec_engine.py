"""Speculative decoding end to end on the real SmolLM2 weights (fp32, CPU): greedy outputs with n-gram drafts
are token-identical to transformers' greedy and to Brigade without speculation, on prompts where drafts are
both accepted and rejected; max_tokens and stop tokens cut exactly; prefix caching and preemption keep
outputs; seeded random sampling is reproducible. Engines are module-scoped (one load each)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from brigade import LLM, SamplingParams
from brigade.sampling_params import StructuredOutputsParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))
from padded_graphs import pad_steps  # noqa: E402

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
MAX_NEW = 24
RAW = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,",
    "The capital of France is",
]
CHAT = ["Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, kiwi, lemon, mango."]


@pytest.fixture(scope="module")
def prompts(hf_reference) -> list[list[int]]:
    tok = hf_reference.tokenizer
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False) for p in CHAT]
    return [tok.encode(p) for p in RAW] + chat


@pytest.fixture(scope="module")
def expected(hf_reference, prompts):
    return hf_reference.generate(prompts, MAX_NEW)


@pytest.fixture(scope="module")
def spec_llm(smollm2_path):
    return LLM(str(smollm2_path), dtype="float32", max_model_len=512, block_size=16, speculative_config=SPEC)


@pytest.fixture(scope="module")
def base_llm(smollm2_path):
    return LLM(str(smollm2_path), dtype="float32", max_model_len=512, block_size=16)


def spec_counts(llm: LLM) -> dict[str, int]:
    return dict(llm.engine.core.scheduler.spec_totals)


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def assert_no_leak(llm: LLM) -> None:
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


def test_greedy_equals_transformers_and_no_speculation(spec_llm, base_llm, prompts, expected):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=2)
    before = spec_counts(spec_llm)
    outs = spec_llm.generate(prompts, params, use_tqdm=False)
    counts = delta(spec_counts(spec_llm), before)
    base = base_llm.generate(prompts, params, use_tqdm=False)
    for i, (out, ref, b) in enumerate(zip(outs, expected, base)):
        assert out.outputs[0].token_ids == ref.token_ids == b.outputs[0].token_ids, f"prompt {i}"
        got = [next(iter(pos.values())).logprob for pos in out.outputs[0].logprobs]
        assert got == pytest.approx(ref.logprobs, abs=1e-4), f"prompt {i}: logprobs are the target model's"
        assert [len(pos) for pos in out.outputs[0].logprobs] == [len(pos) for pos in b.outputs[0].logprobs]
    # Both branches ran: drafts proposed, some accepted, some rejected.
    assert counts["num_drafts"] > 0 and counts["num_draft_tokens"] > 0
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"], counts
    assert_no_leak(spec_llm)


def test_padded_verification_steps_give_the_same_tokens(spec_llm, base_llm, prompts, expected):
    """The layout the GPU's verification CUDA graphs replay (every request padded to 1 + k query tokens,
    padding after its real tokens, writing no KV), run eagerly here through the ``pad_spec_steps`` of a test
    ``GraphDispatch`` (tests/worker/padded_graphs.py): greedy tokens and logprobs equal transformers' and the
    unpadded path's, in batches and at batch 1."""
    dispatch = pad_steps(spec_llm.engine.core.executor.worker.model_runner)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=2)
    unpadded = spec_llm.generate(prompts, params, use_tqdm=False)
    dispatch.pad_spec_steps = True
    try:
        before, padded_steps = spec_counts(spec_llm), dispatch.num_padded_spec_steps
        outs = spec_llm.generate(prompts, params, use_tqdm=False)
        single = [spec_llm.generate([p], params, use_tqdm=False)[0] for p in prompts[:2]]
        counts = delta(spec_counts(spec_llm), before)
    finally:
        dispatch.pad_spec_steps = False
    for i, (out, ref, plain) in enumerate(zip(outs, expected, unpadded)):
        assert out.outputs[0].token_ids == ref.token_ids == plain.outputs[0].token_ids, f"prompt {i}"
        got = [next(iter(pos.values())).logprob for pos in out.outputs[0].logprobs]
        assert got == pytest.approx(ref.logprobs, abs=1e-4), f"prompt {i}"
    for i, out in enumerate(single):
        assert out.outputs[0].token_ids == expected[i].token_ids, f"prompt {i} alone"
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"], counts
    assert dispatch.num_padded_spec_steps - padded_steps >= counts["num_drafts"] // len(prompts), \
        "the padded layout was not used"
    assert_no_leak(spec_llm)


def test_mixed_graph_layout_runs_verification_steps(spec_llm, prompts, expected):
    """Verification steps that no verification graph takes (on a GPU: more than 32 requests) replay mixed-step
    graphs instead; that padded layout (token rows padded with slot -1, padding requests of query length 0, the
    1 + k logits rows of each drafted request gathered inside the forward), run eagerly here through the
    ``pad_mixed_steps`` of a test ``GraphDispatch``: greedy tokens and logprobs equal transformers'."""
    dispatch = pad_steps(spec_llm.engine.core.executor.worker.model_runner)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=2)
    dispatch.pad_mixed_steps = True
    try:
        before, padded_steps = spec_counts(spec_llm), dispatch.num_padded_mixed_steps
        outs = spec_llm.generate(prompts, params, use_tqdm=False)
        counts = delta(spec_counts(spec_llm), before)
    finally:
        dispatch.pad_mixed_steps = False
    for i, (out, ref) in enumerate(zip(outs, expected)):
        assert out.outputs[0].token_ids == ref.token_ids, f"prompt {i}"
        got = [next(iter(pos.values())).logprob for pos in out.outputs[0].logprobs]
        assert got == pytest.approx(ref.logprobs, abs=1e-4), f"prompt {i}"
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"], counts
    assert dispatch.num_padded_mixed_steps - padded_steps >= counts["num_drafts"] // len(prompts), \
        "the mixed layout was not used"
    assert_no_leak(spec_llm)


def test_batch_mixes_spec_and_non_spec_requests(spec_llm, base_llm, prompts, expected):
    """A grammar-constrained request (never drafted) and a penalized one (drafted; its penalty must see the
    drafts before each position) run with plain greedy ones and give what they give without speculation."""
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    choice = SamplingParams(temperature=0.0, max_tokens=8,
                            structured_outputs=StructuredOutputsParams(choice=["apple pie", "banana split"]))
    penalized = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, repetition_penalty=1.3, presence_penalty=0.5)
    batch = [prompts[0], prompts[3], prompts[1], prompts[0]]
    params = [greedy, choice, penalized, penalized]
    before = spec_counts(spec_llm)
    outs = spec_llm.generate(batch, params, use_tqdm=False)
    assert spec_counts(spec_llm)["num_drafts"] > before["num_drafts"]
    base = base_llm.generate(batch, params, use_tqdm=False)
    assert outs[0].outputs[0].token_ids == expected[0].token_ids
    assert outs[1].outputs[0].text in ("apple pie", "banana split")
    for i, (a, b) in enumerate(zip(outs, base)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids, f"request {i}"
    assert_no_leak(spec_llm)


def test_max_tokens_cuts_exactly(spec_llm, prompts, expected):
    lengths = [1, 2, 3, 5, 7, 11, 13]
    outs = spec_llm.generate([prompts[1]] * len(lengths),
                             [SamplingParams(temperature=0.0, max_tokens=n) for n in lengths], use_tqdm=False)
    for n, out in zip(lengths, outs):
        assert out.outputs[0].token_ids == expected[1].token_ids[:n]
        assert len(out.outputs[0].token_ids) == n and out.outputs[0].finish_reason == "length"


def test_stop_token_inside_accepted_drafts(spec_llm, prompts, expected):
    ref = expected[1].token_ids  # the counting prompt (" 4, 5, 6, ..."): long accepted runs
    stop = next(t for t in ref[4:] if t not in ref[:4])  # first seen after the prefill and first steps
    cut = ref[:ref.index(stop) + 1]
    seen = []
    core = spec_llm.engine.core
    execute = core.executor.execute_model

    def recording(scheduler_output, *args, **kwargs):  # observe the runner's real outputs
        out = execute(scheduler_output, *args, **kwargs)
        seen.append(out)
        return out

    core.executor.execute_model = recording
    try:
        out = spec_llm.generate([prompts[1]], SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                                             stop_token_ids=[stop]), use_tqdm=False)[0]
    finally:
        core.executor.execute_model = execute
    assert out.outputs[0].token_ids == cut and out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop
    last = [t for o in seen for t in o.sampled_token_ids if t][-1]
    assert len(last) > 1 and last.index(stop) < len(last) - 1, \
        f"the stop token should sit inside the last step's accepted tokens {last}"
    assert_no_leak(spec_llm)


def test_prefix_caching_with_speculation(spec_llm, prompts, expected):
    params = SamplingParams(temperature=0.0, max_tokens=16)
    first = spec_llm.generate([prompts[0]], params, use_tqdm=False)[0]
    second = spec_llm.generate([prompts[0]], params, use_tqdm=False)[0]
    assert second.num_cached_tokens > 0, "the second identical request should hit the cache"
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == expected[0].token_ids[:16]
    # A prompt that extends the first output (its KV was computed with drafts) hits past the prompt's blocks.
    extended = prompts[0] + expected[0].token_ids[:16]
    third = spec_llm.generate([extended], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0]
    assert third.num_cached_tokens > (len(prompts[0]) // 16) * 16
    assert third.outputs[0].token_ids == expected[0].token_ids[16:24]
    assert_no_leak(spec_llm)


def test_preemption_under_a_small_pool(smollm2_path, prompts, expected):
    # 16 blocks of 16 tokens (15 usable): one request of max_model_len fits, the whole batch at once does not.
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=240, block_size=16, num_gpu_blocks_override=16,
              speculative_config=SPEC)
    batch = prompts * 2
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), use_tqdm=False)
    assert llm.engine.core.scheduler.num_preemptions_total > 0, "the small KV pool should have forced preemption"
    for i, out in enumerate(outs):
        assert out.outputs[0].token_ids == expected[i % len(prompts)].token_ids, f"request {i}"
    assert spec_counts(llm)["num_accepted_tokens"] > 0
    assert_no_leak(llm)


def test_seeded_random_sampling_is_reproducible(spec_llm, prompts):
    params = [SamplingParams(temperature=0.7, top_p=0.95, max_tokens=16, seed=s) for s in (1, 2)]
    before = spec_counts(spec_llm)
    first = spec_llm.generate([prompts[1]] * 2, params, use_tqdm=False)
    second = spec_llm.generate([prompts[1]] * 2, params, use_tqdm=False)
    counts = delta(spec_counts(spec_llm), before)
    assert counts["num_accepted_tokens"] > 0, "drafts must be accepted on the random path too"
    for a, b in zip(first, second):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_stop_string_inside_a_step_cuts_like_without_speculation(spec_llm, base_llm, prompts):
    """Stop strings are the front end's: with several tokens in one step, the tokens after the one completing
    the stop string are dropped, so text, token ids and logprobs equal decoding without speculation."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, stop=["6,", "9,"], logprobs=1)
    before = spec_counts(spec_llm)
    out = spec_llm.generate([prompts[1]], params, use_tqdm=False)[0].outputs[0]
    assert spec_counts(spec_llm)["num_accepted_tokens"] > before["num_accepted_tokens"]
    ref = base_llm.generate([prompts[1]], params, use_tqdm=False)[0].outputs[0]
    assert (out.text, out.token_ids, out.finish_reason, out.stop_reason) == \
        (ref.text, ref.token_ids, "stop", "6,")
    assert len(out.logprobs) == len(ref.logprobs) == len(ref.token_ids)
    assert out.cumulative_logprob == pytest.approx(ref.cumulative_logprob, abs=1e-3)
