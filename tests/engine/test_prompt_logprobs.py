"""Prompt logprobs (SamplingParams.prompt_logprobs) against HF transformers on SmolLM2 in fp32 on the CPU.

Each prompt token but the first gets exactly one entry, scored from the raw logits, through chunked
prefill, a prefix-cache hit (cached tokens are recomputed for such requests) and preemption.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from brigade import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))
from padded_graphs import pad_steps  # noqa: E402

PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 3 + "Then the dog",
           "Water boils at one hundred degrees Celsius at sea level, but at altitude"]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    # 16-token prefill chunks and 10 blocks of 8 tokens (9 usable: block 0 is the null block): prompts are
    # scored over several chunks, and the two requests cannot both keep their blocks as they grow, so one is
    # preempted and recomputed.
    return LLM(str(smollm2_path), dtype="float32", max_model_len=72, block_size=8, max_num_batched_tokens=16,
               num_gpu_blocks_override=10, enable_prefix_caching=True, max_num_seqs=4)


def check_against_reference(output, reference: list[float | None], num_top: int) -> None:
    got = output.prompt_logprobs
    assert got is not None and len(got) == len(output.prompt_token_ids) == len(reference)
    assert got[0] is None and reference[0] is None
    for token_id, entry, want in zip(output.prompt_token_ids[1:], got[1:], reference[1:]):
        chosen = entry[token_id]
        assert math.isclose(chosen.logprob, want, abs_tol=2e-3), (token_id, chosen.logprob, want)
        assert len(entry) in (num_top, num_top + 1)  # the top candidates, plus the prompt token if not among them
        top = sorted((lp for tid, lp in entry.items() if lp.rank <= num_top), key=lambda lp: lp.rank)
        assert [lp.rank for lp in top] == list(range(1, num_top + 1))
        assert all(a.logprob >= b.logprob for a, b in zip(top, top[1:]))
        if top:  # the best candidate is at least as likely as the prompt token, and is it when ranked 1
            assert chosen.logprob <= top[0].logprob + 1e-6
            assert chosen.rank != 1 or math.isclose(chosen.logprob, top[0].logprob, abs_tol=1e-6)


def test_prompt_logprobs_match_transformers_through_chunks_preemption_and_cache(llm, hf_reference):
    tok = hf_reference.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    references = [hf_reference.prompt_logprobs(p) for p in prompts]
    scheduler = llm.engine.core.scheduler
    before = scheduler.num_preemptions_total
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=3)
    for output, reference in zip(llm.generate(prompts, params, use_tqdm=False), references):
        check_against_reference(output, reference, 3)  # once per prompt token, even after a recompute
    assert scheduler.num_preemptions_total > before, "the small KV pool should force a preemption"
    # The first prompt again: its blocks are cached, yet every prompt token is scored again.
    again = llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0),
                         use_tqdm=False)
    check_against_reference(again[0], references[0], 0)
    stats = llm.engine.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_prompt_logprobs_through_the_mixed_graph_layout(llm, hf_reference):
    """Steps with prompt logprobs may replay mixed-step CUDA graphs (which end with the hidden states the prompt
    tokens are scored from); that padded layout, run eagerly here through the ``pad_mixed_steps`` of a test
    ``GraphDispatch`` (tests/worker/padded_graphs.py), scores every prompt token as transformers does."""
    tok = hf_reference.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    references = [hf_reference.prompt_logprobs(p) for p in prompts]
    dispatch = pad_steps(llm.engine.core.executor.worker.model_runner)
    dispatch.pad_mixed_steps = True
    try:
        before = dispatch.num_padded_mixed_steps
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                       prompt_logprobs=2), use_tqdm=False)
    finally:
        dispatch.pad_mixed_steps = False
    for output, reference in zip(outputs, references):
        check_against_reference(output, reference, 2)
    assert dispatch.num_padded_mixed_steps - before >= 4, "the mixed layout was not used"
