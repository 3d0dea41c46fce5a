"""The hybrid KV cache manager: one block pool for a full-attention and a sliding-window group (vLLM v1's
HybridKVCacheCoordinator), under the real scheduler. No model and no tensors."""

from __future__ import annotations

import time

from brigade.config import CacheConfig, SchedulerConfig
from brigade.core.kv_cache_manager import KVCacheManager
from brigade.core.request import Request, RequestStatus
from brigade.core.scheduler import Scheduler
from brigade.interfaces import ModelRunnerOutput
from brigade.interfaces.kv_cache_spec import FullAttentionSpec, SlidingWindowSpec, cdiv, group_layers
from brigade.sampling_params import SamplingParams

BLOCK = 4
WINDOW = 8
FULL = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype="float32")
SLIDING = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype="float32", sliding_window=WINDOW)


def make_request(rid: str, prompt, max_tokens: int = 4) -> Request:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, list(prompt), params, 0, time.time(), max_tokens=max_tokens)


def make_scheduler(num_blocks: int = 64, budget: int = 16, caching: bool = True) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget),
                     CacheConfig(block_size=BLOCK, enable_prefix_caching=caching), max_model_len=512,
                     num_blocks=num_blocks, kv_cache_specs=[FULL, SLIDING])


def run_step(sched: Scheduler, token: int = 7):
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [[token] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
    sched.update_from_output(out, ModelRunnerOutput(ids, sampled))
    return out


def test_sliding_window_group_holds_a_bounded_number_of_blocks_during_a_long_generation():
    budget = 16
    sched = make_scheduler(budget=budget)
    kv = sched.kv_cache_manager
    sched.add_request(make_request("a", range(1, 41), max_tokens=60))  # prefilled in chunks of 16, then decodes
    bound = cdiv(WINDOW - 1 + budget, BLOCK) + 1
    tables = ([], [])  # the runner's view, rebuilt from the step messages
    steps = 0
    while "a" in sched.requests:
        out = run_step(sched)
        steps += 1
        for new in out.scheduled_new_reqs:
            tables = tuple(list(ids) for ids in new.block_ids)
        for new_ids in out.scheduled_cached_reqs.new_block_ids:
            for table, ids in zip(tables, new_ids):
                table.extend(ids)
        if "a" not in sched.requests:
            break
        request = sched.requests["a"]
        full_held, sliding_held = kv.num_held_blocks("a")
        assert sliding_held <= bound, f"step {steps}: {sliding_held} sliding-window blocks held, bound {bound}"
        assert full_held == cdiv(request.num_computed_tokens, BLOCK)
        # Both tables cover every computed token; the sliding one is mostly the null block by now.
        assert len(tables[0]) == len(tables[1]) == cdiv(request.num_computed_tokens, BLOCK)
        assert kv.get_block_ids("a")[0] == tables[0]
    assert steps > 40 and kv.get_num_free_blocks() == kv.num_usable_blocks


def test_every_block_returns_after_finish_abort_and_preemption():
    sched = make_scheduler(num_blocks=24, budget=16)
    kv = sched.kv_cache_manager
    for i in range(4):
        sched.add_request(make_request(f"r{i}", range(100 * i + 1, 100 * i + 23), max_tokens=30))
    preempted = False
    for _ in range(400):
        if not sched.requests:
            break
        out = run_step(sched)
        preempted |= bool(out.preempted_req_ids)
        if "r3" in sched.requests and sched.requests["r3"].num_output_tokens == 5:
            sched.finish_requests(["r3"], RequestStatus.FINISHED_ABORTED)
    assert preempted, "the small pool must force a preemption"
    assert not sched.requests and kv.get_num_free_blocks() == kv.num_usable_blocks
    assert all(not m.req_to_blocks for m in kv.managers)


def _cache(kv: KVCacheManager, request: Request, group_id: int, indices) -> None:
    """Put blocks holding ``request``'s blocks ``indices`` of one group in the prefix cache (then free them)."""
    kv._update_block_hashes(request)
    blocks = kv.pool.get_new_blocks(len(indices))
    for block, i in zip(blocks, indices):
        kv.pool.cache_block(block, request.block_hashes[i], group_id)
    kv.pool.free_blocks(blocks)


def test_prefix_hit_is_limited_by_the_sliding_window_groups_cached_window():
    kv = KVCacheManager(64, BLOCK, True, specs=[FULL, SLIDING])
    request = make_request("a", range(1, 42))  # 41 tokens: at most 10 blocks hit
    _cache(kv, request, 0, range(10))
    _cache(kv, request, 1, [0, 1, 5, 6])  # the window of position 28 (tokens 21..27: blocks 5, 6) is cached
    hits, num_hit = kv.get_computed_blocks(request)
    assert num_hit == 7 * BLOCK
    assert [b.block_id for b in hits[0]] == [kv.pool.get_cached_block(h, 0).block_id for h in request.block_hashes[:7]]
    assert [b.is_null for b in hits[1]] == [True] * 5 + [False] * 2
    free = kv.get_num_free_blocks()
    new_ids = kv.allocate_slots(request, request.num_tokens - num_hit, hits, num_hit)
    # The full group takes 7 hits and 4 new blocks (41 tokens), the sliding group 2 hits and 4 new blocks.
    assert [len(ids) for ids in new_ids] == [4, 4] and kv.get_num_free_blocks() == free - 7 - 2 - 8
    assert kv.get_block_ids("a")[1][:5] == [0] * 5
    kv.free(request)
    assert kv.get_num_free_blocks() == kv.num_usable_blocks


def test_prefix_hit_is_limited_by_full_attention_and_by_a_short_sliding_run():
    kv = KVCacheManager(64, BLOCK, True, specs=[FULL, SLIDING])
    request = make_request("a", range(1, 42))
    _cache(kv, request, 0, range(4))
    _cache(kv, request, 1, range(10))
    hits, num_hit = kv.get_computed_blocks(request)
    assert num_hit == 4 * BLOCK and [b.is_null for b in hits[1]] == [True, True, False, False]
    kv.pool.reset_prefix_cache()
    _cache(kv, request, 0, range(10))
    _cache(kv, request, 1, [0, 9])  # no two contiguous blocks but the first one: a 1-block hit from the start
    assert kv.get_computed_blocks(request)[1] == 1 * BLOCK


def test_a_finished_requests_prompt_is_hit_by_the_next_one_in_both_groups():
    sched = make_scheduler()
    prompt = list(range(1, 34))  # 33 tokens
    sched.add_request(make_request("a", prompt, max_tokens=2))
    while sched.requests:
        run_step(sched)
    sched.add_request(make_request("b", prompt, max_tokens=2))
    out = sched.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 32
    full_ids, sliding_ids = out.scheduled_new_reqs[0].block_ids
    assert len(full_ids) == len(sliding_ids) == 9 and sliding_ids[:6] == [0] * 6 and 0 not in sliding_ids[6:]


def test_allocation_is_all_or_nothing_across_groups():
    kv = KVCacheManager(12, BLOCK, False, specs=[FULL, SLIDING])  # 11 usable blocks
    request = make_request("a", range(1, 25))  # 24 tokens: 6 blocks in each group
    assert kv.allocate_slots(request, 24) is None
    assert kv.get_num_free_blocks() == 11 and kv.get_block_ids("a") == ([], [])
    assert kv.allocate_slots(request, 20) is not None and kv.num_held_blocks("a") == [5, 5]


def test_group_layers_on_a_five_to_one_sliding_to_full_pattern():
    specs = {layer: FULL if layer % 6 == 5 else SLIDING for layer in range(12)}
    groups = group_layers(specs)
    assert [(g.spec.kind, g.layer_ids) for g in groups] == [
        ("full", (5, 11)), ("sliding_window", (0, 1)), ("sliding_window", (2, 3)), ("sliding_window", (4, 6)),
        ("sliding_window", (7, 8)), ("sliding_window", (9, 10))]
    assert [(g.spec, g.layer_ids) for g in group_layers({i: FULL for i in range(4)})] == [(FULL, (0, 1, 2, 3))]
