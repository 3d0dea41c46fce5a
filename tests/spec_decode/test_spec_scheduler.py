"""Scheduler with speculative decoding: drafts scheduled with their KV slots, rollback over rejected drafts,
stop conditions token by token over accepted tokens, caps at max_tokens, no rejected token in the prefix
cache. The runner's part is played by hand-made ModelRunnerOutputs, as in tests/core/test_scheduler.py."""

from __future__ import annotations

import time

from brigade.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from brigade.core.request import Request, RequestStatus
from brigade.core.scheduler import Scheduler
from brigade.interfaces import FinishReason, ModelRunnerOutput
from brigade.sampling_params import SamplingParams

EOS = 0
# Prompt whose suffix [5, 6] occurred before, followed by 7 8 9 5: the proposer drafts those (k = 4).
PROMPT = [1, 5, 6, 7, 8, 9, 5, 6]


def make_scheduler(k=4, num_blocks=64, block_size=4, budget=64, max_model_len=256, caching=True):
    return Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget),
                     CacheConfig(block_size=block_size, enable_prefix_caching=caching),
                     max_model_len=max_model_len, num_blocks=num_blocks,
                     speculative_config=SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_max=2,
                                                          prompt_lookup_min=1))


def make_request(rid, prompt=PROMPT, max_tokens=16, **kw):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
    return Request(rid, list(prompt), params, EOS, time.time(), max_tokens=max_tokens)


def step(sched, tokens_for):
    """Schedule, then answer each sampling request with tokens_for(req_id, drafts)."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        drafts = out.scheduled_spec_decode_tokens.get(rid, [])
        done = req.num_computed_tokens - len(drafts) >= req.num_tokens
        sampled.append(tokens_for(rid, drafts) if done else [])
    return out, sched.update_from_output(out, ModelRunnerOutput(ids, sampled))


def test_drafts_are_scheduled_with_slots_and_rejected_ones_rolled_back():
    sched = make_scheduler()
    sched.add_request(make_request("a"))
    out, _ = step(sched, lambda rid, d: [7])  # prefill; first token 7 -> suffix [6, 7] -> drafts 8 9 5 6
    req = sched.requests["a"]
    assert req.spec_token_ids == [8, 9, 5, 6]
    out, outputs = step(sched, lambda rid, d: [8, 9, 42])  # 2 accepted, third rejected: correction 42
    assert out.scheduled_spec_decode_tokens == {"a": [8, 9, 5, 6]}
    assert out.num_scheduled_tokens == {"a": 5}
    assert outputs.outputs[0].new_token_ids == [8, 9, 42]
    assert req.output_token_ids == [7, 8, 9, 42]
    assert req.num_computed_tokens == req.num_tokens - 1, "rolled back over the 2 rejected drafts"
    assert sched.spec_totals == {"num_drafts": 1, "num_draft_tokens": 4, "num_accepted_tokens": 2}
    stats = outputs.scheduler_stats.spec_decoding  # this step's counters
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 4, 2)
    assert stats.num_accepted_tokens_per_pos == [1, 1, 0, 0]


def test_stop_token_inside_accepted_drafts_truncates_right_after_it():
    sched = make_scheduler()
    sched.add_request(make_request("a", stop_token_ids=[9]))
    step(sched, lambda rid, d: [7])
    _, outputs = step(sched, lambda rid, d: [8, 9, 5, 6, 11])  # all 4 accepted + bonus, but 9 stops
    out = outputs.outputs[0]
    assert out.new_token_ids == [8, 9] and out.finish_reason == FinishReason.STOP and out.stop_reason == 9
    assert "a" not in sched.requests
    assert sched.kv_cache_manager.get_num_free_blocks() == sched.kv_cache_manager.num_usable_blocks


def test_eos_respects_min_tokens_token_by_token():
    sched = make_scheduler()
    sched.add_request(make_request("a", min_tokens=4))
    step(sched, lambda rid, d: [7])
    # EOS as the 3rd output token is below min_tokens 4 (the check is per token), the one at the 5th stops.
    _, outputs = step(sched, lambda rid, d: [8, EOS, 5, EOS])
    assert outputs.outputs[0].new_token_ids == [8, EOS, 5, EOS]
    assert outputs.outputs[0].finish_reason == FinishReason.STOP


def test_drafts_capped_by_max_tokens_and_budget():
    sched = make_scheduler()
    sched.add_request(make_request("a", max_tokens=3))
    step(sched, lambda rid, d: [7])
    assert sched.requests["a"].spec_token_ids == [8], "2 tokens left: 1 draft + 1 bonus at most"
    out, outputs = step(sched, lambda rid, d: d + [99])
    assert out.scheduled_spec_decode_tokens == {"a": [8]}
    assert outputs.outputs[0].new_token_ids == [8, 99]
    assert outputs.outputs[0].finish_reason == FinishReason.LENGTH

    sched = make_scheduler(budget=3)
    sched.add_request(make_request("b", prompt=[3, 1]))  # 2 tokens: fits the budget of 3
    step(sched, lambda rid, d: [3])
    sched.requests["b"].spec_token_ids = [1, 3, 1]
    out, _ = step(sched, lambda rid, d: d + [5])
    assert out.scheduled_spec_decode_tokens == {"b": [1, 3]} and out.num_scheduled_tokens == {"b": 3}


def test_rejected_tokens_never_reach_the_prefix_cache():
    sched = make_scheduler(block_size=4)
    sched.add_request(make_request("a", max_tokens=12))
    step(sched, lambda rid, d: [7])  # 9 tokens, 2 full blocks hashed
    cached_before = set(sched.kv_cache_manager.pool.cached)
    # drafts 8 9 5 6 at positions 9..12; all rejected: the block of positions 8..11 holds draft KV
    _, outputs = step(sched, lambda rid, d: [40])
    req = sched.requests["a"]
    assert req.all_token_ids == PROMPT + [7, 40]
    assert set(sched.kv_cache_manager.pool.cached) == cached_before, "no block with a draft was hashed"
    # Finish the request; every hashed block must hold the request's real tokens only.
    while "a" in sched.requests:
        step(sched, lambda rid, d: [41])
    tokens = req.all_token_ids
    hasher = sched.kv_cache_manager.hasher
    expected = []
    hasher.extend_hashes(expected, tokens, 4, None, None)
    assert {block_hash for block_hash, _ in sched.kv_cache_manager.pool.cached} <= set(expected)


def test_drafts_are_dropped_before_anyone_is_preempted():
    sched = make_scheduler(num_blocks=4, block_size=4)  # 3 usable blocks of 4 = 12 slots
    sched.add_request(make_request("a", max_tokens=8))  # 8 prompt tokens: 2 blocks
    step(sched, lambda rid, d: [7])
    assert sched.requests["a"].spec_token_ids == [8, 9, 5, 6]  # would need 13 slots: 4 blocks
    out, _ = step(sched, lambda rid, d: [8])
    assert out.scheduled_spec_decode_tokens == {} and out.num_scheduled_tokens == {"a": 1}
    assert not out.preempted_req_ids


def test_preemption_drops_drafts():
    sched = make_scheduler(num_blocks=6, block_size=4)  # 5 usable blocks of 4 = 20 slots
    sched.add_request(make_request("a", max_tokens=10))
    sched.add_request(make_request("b", prompt=[9, 9, 9, 9, 9, 9, 9, 9], max_tokens=10))
    step(sched, lambda rid, d: [7] if rid == "a" else [9])
    assert sched.requests["b"].spec_token_ids
    out, _ = step(sched, lambda rid, d: d + [1])
    assert out.preempted_req_ids == {"b"} and sched.requests["b"].spec_token_ids == []
    assert sched.requests["b"].status == RequestStatus.PREEMPTED
