"""Brigade's greedy tokens equal HF transformers' on the real SmolLM2 weights, in fp32 on the CPU.

All prompts go in at once, 48 new tokens each, under engine configurations that exercise chunked prefill,
preemption, prefix caching on and off and overlapped scheduling; every KV block must be back in the pool afterwards.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from brigade import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))
from padded_graphs import pad_steps  # noqa: E402

MAX_NEW_TOKENS = 48

RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1969, the first humans",
    "Water boils at",
    "A haiku about autumn:\n",
    "The quick brown fox jumps over the lazy dog. " * 6 + "Then the dog",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the moon.",
    "Explain what a hash table is in two sentences.",
    "List three fruits that are red.",
]


@pytest.fixture(scope="module")
def prompt_token_ids(hf_reference) -> list[list[int]]:
    tok = hf_reference.tokenizer
    raw = [tok.encode(p) for p in RAW_PROMPTS]
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False)
            for p in CHAT_PROMPTS]
    return raw + chat


@pytest.fixture(scope="module")
def expected(hf_reference, prompt_token_ids):
    return hf_reference.generate(prompt_token_ids, MAX_NEW_TOKENS)


CONFIGS = {
    "default": {},  # prefix caching on, whole prompts in one step
    "chunked_prefill_no_prefix_caching": {"max_num_batched_tokens": 16, "enable_prefix_caching": False},
    # 24 blocks of 16 tokens: one request of max_model_len fits, a few of them together do not.
    "preemption": {"num_gpu_blocks_override": 24, "block_size": 16, "max_model_len": 368},
    # Overlapped (async) scheduling, the GPU default, with steps that sample nothing (two requests' prompt
    # chunks only): such a step's output is ready at once. Two requests at a time make it the slowest config, and
    # what it checks happens in the prompts' steps: 24 new tokens each (greedy decoding is prefix-consistent).
    "overlapped_chunks": {"async_scheduling": True, "max_num_batched_tokens": 16, "max_num_seqs": 2,
                          "max_tokens": 24},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_equal_transformers(name, smollm2_path, prompt_token_ids, expected):
    engine_args = dict(CONFIGS[name])
    num_new = engine_args.pop("max_tokens", MAX_NEW_TOKENS)
    llm = LLM(str(smollm2_path), dtype="float32", **{"max_model_len": 512, **engine_args})
    params = SamplingParams(temperature=0.0, max_tokens=num_new, logprobs=0)
    outputs = llm.generate(prompt_token_ids, params, use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outputs, (r.truncated(num_new) for r in expected))):
        assert out.outputs[0].token_ids == ref.token_ids, f"prompt {i} differs under {name}"
        # logprobs of the chosen tokens come from the raw logits and match transformers'
        got = [next(iter(pos.values())).logprob for pos in out.outputs[0].logprobs]
        assert got == pytest.approx(ref.logprobs, abs=1e-4), f"prompt {i} logprobs under {name}"
    scheduler = llm.engine.core.scheduler
    if name == "preemption":
        assert scheduler.num_preemptions_total > 0, "the small KV pool should have forced preemption"
    if name == "overlapped_chunks":
        assert llm.engine.core.overlap
    if name == "chunked_prefill_no_prefix_caching":
        assert all(o.num_cached_tokens == 0 for o in outputs), "prefix caching is off"
        assert max(len(p) for p in prompt_token_ids) > 16, "some prompt must need several chunks"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


def test_prefix_cache_hits_do_not_change_outputs(smollm2_path, prompt_token_ids, expected):
    # Greedy decoding is prefix-consistent, so 16 tokens of transformers' 48 are the reference here.
    num_new = 16
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=512, block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=num_new)
    first = llm.generate(prompt_token_ids, params, use_tqdm=False)
    second = llm.generate(prompt_token_ids, params, use_tqdm=False)
    long_prompts = [i for i, p in enumerate(prompt_token_ids) if len(p) > 16]
    assert all(second[i].num_cached_tokens > 0 for i in long_prompts), "the second pass should hit the cache"
    for a, b, ref in zip(first, second, expected):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids == ref.token_ids[:num_new]
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_mixed_graph_layout_gives_the_same_tokens(smollm2_path, prompt_token_ids, expected, monkeypatch):
    """The layout mixed-step CUDA graphs replay (``MixedGraphs``: token rows padded to 8, 16 or 32 with slot -1,
    requests padded with query length 0, logits gathered inside the forward), run eagerly here through the
    ``pad_mixed_steps`` of a test ``GraphDispatch`` (tests/worker/padded_graphs.py) with every step in it
    (chunked prefills of up to 32 tokens mixed with decodes, then prefix-cache hits on a second pass): greedy
    tokens and logprobs equal transformers'."""
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=512, max_num_batched_tokens=32, max_num_seqs=8,
              mixed_capture_sizes=[8, 16, 32])
    dispatch = pad_steps(llm.engine.core.executor.worker.model_runner)
    dispatch.pad_mixed_steps = True
    # The chunked prefills mix with decodes in the first steps; 24 new tokens then, and the second pass (prefix-cache
    # hits) 16: greedy decoding is prefix-consistent, so transformers' 48 tokens cut short are the reference.
    for attempt, num_new in enumerate((24, 16)):
        params = SamplingParams(temperature=0.0, max_tokens=num_new, logprobs=0)
        outputs = llm.generate(prompt_token_ids, params, use_tqdm=False)
        for i, (out, ref) in enumerate(zip(outputs, expected)):
            ref = ref.truncated(num_new)
            assert out.outputs[0].token_ids == ref.token_ids, f"prompt {i}, pass {attempt}"
            got = [next(iter(pos.values())).logprob for pos in out.outputs[0].logprobs]
            assert got == pytest.approx(ref.logprobs, abs=1e-4), f"prompt {i} logprobs, pass {attempt}"
    assert outputs[-1].num_cached_tokens > 0, "the second pass should hit the prefix cache"
    graphs = dispatch.pad_mixed_steps_graphs
    assert graphs is not None and graphs.max_reqs == 8
    # Every step fits (at most 32 tokens), so every step ran padded: at least one per generated token.
    assert dispatch.num_padded_mixed_steps >= 24 + 16
    # Steps with a context longer than the backend's mixed_graph_max_context run eagerly.
    monkeypatch.setattr(dispatch.attn_backend, "mixed_graph_max_context", 20)
    short, long = prompt_token_ids[0], prompt_token_ids[7]
    assert len(short) + 4 <= 20 < len(long)
    before = dispatch.num_padded_mixed_steps
    llm.generate([long], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert dispatch.num_padded_mixed_steps == before
    out = llm.generate([short], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert dispatch.num_padded_mixed_steps > before and out[0].outputs[0].token_ids == expected[0].token_ids[:4]
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"
