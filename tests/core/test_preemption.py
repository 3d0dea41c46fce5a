"""Preemption victims: the tail of ``running`` under fcfs, the lowest-priority request under
``--scheduling-policy priority`` (largest priority value, then latest arrival, as vLLM v1 picks it)."""

from __future__ import annotations

import pytest
import scheduler_steps
from scheduler_steps import run_step, run_until_done

from brigade.core.request import RequestStatus


def make_scheduler(policy, num_blocks=5, block_size=4):
    """Without prefix caching, with a 64-token budget."""
    return scheduler_steps.make_scheduler(policy=policy, num_blocks=num_blocks, block_size=block_size, budget=64,
                                          caching=False)


def make_request(rid, prompt, priority=0, max_tokens=8):
    return scheduler_steps.make_request(rid, prompt, max_tokens=max_tokens, priority=priority, ignore_eos=True)


def three_running(policy):
    """4 usable blocks of 4 tokens. ``low`` (priority 5) runs first and alone, then ``high`` (0) and ``mid`` (1)
    join, so ``running`` is [low, high, mid] and every block is taken; the next step, ``high`` needs a second
    block."""
    sched = make_scheduler(policy)
    sched.add_request(make_request("low", [1, 2, 3, 4], priority=5))
    run_step(sched)  # low: prefill 4 tokens (1 block), first token sampled
    sched.add_request(make_request("high", [20, 21, 22, 23], priority=0))
    sched.add_request(make_request("mid", [10, 11, 12, 13], priority=1))
    out, _ = run_step(sched)  # low decodes into its second block; high and mid prefill (1 block each)
    assert [r.request_id for r in sched.running] == ["low", "high", "mid"]
    assert not out.preempted_req_ids and sched.kv_cache_manager.get_num_free_blocks() == 0
    return sched


def test_priority_preempts_the_lowest_priority_request_not_the_tail():
    sched = three_running("priority")
    out = sched.schedule()
    assert out.preempted_req_ids == {"low"}, "low has the largest priority value, though mid is last in running"
    low = sched.requests["low"]
    assert low.status == RequestStatus.PREEMPTED and low.num_computed_tokens == 0
    assert low in list(sched.waiting) and low not in sched.running
    # low was scheduled earlier in the step (its decode fitted its block): it is taken back out of the step.
    assert out.num_scheduled_tokens == {"high": 1, "mid": 1} and out.total_num_scheduled_tokens == 2
    assert out.scheduled_cached_reqs.req_ids == ["high", "mid"]
    assert [len(b) for (b,) in out.scheduled_cached_reqs.new_block_ids] == [1, 1]


def test_fcfs_preempts_the_tail_of_running():
    sched = three_running("fcfs")
    out = sched.schedule()
    assert out.preempted_req_ids == {"mid"}, "the last running request goes first"
    assert out.num_scheduled_tokens == {"low": 1, "high": 1}
    assert sched.requests["mid"].status == RequestStatus.PREEMPTED


def test_priority_latest_arrival_breaks_a_tie():
    # first, later (same priority, arrived after it) and top join one step apart: running [first, later, top],
    # all 5 usable blocks taken; then top needs a second block.
    sched = make_scheduler("priority", num_blocks=6)
    first = make_request("first", [1, 2, 3, 4], priority=3)
    sched.add_request(first)
    run_step(sched)
    later = make_request("later", [10, 11, 12, 13], priority=3)
    later.arrival_time = first.arrival_time + 1.0
    sched.add_request(later)
    run_step(sched)
    sched.add_request(make_request("top", [20, 21, 22, 23], priority=0))
    run_step(sched)
    assert [r.request_id for r in sched.running] == ["first", "later", "top"]
    assert sched.kv_cache_manager.get_num_free_blocks() == 0
    out = sched.schedule()
    assert out.preempted_req_ids == {"later"}, "of the two lowest priorities, the later arrival goes"
    assert out.num_scheduled_tokens == {"first": 1, "top": 1}


def test_priority_preempts_the_request_being_scheduled_when_it_is_the_lowest():
    # running [high, low]: high decodes into its free slot, low needs a block and is itself the victim.
    sched = make_scheduler("priority", num_blocks=4)  # 3 usable blocks
    sched.add_request(make_request("high", [1, 2, 3, 4, 5, 6, 7], priority=0))  # 2 blocks
    sched.add_request(make_request("low", [10, 11, 12, 13], priority=9))  # 1 block
    run_step(sched)
    assert [r.request_id for r in sched.running] == ["high", "low"]
    out = sched.schedule()
    assert out.preempted_req_ids == {"low"} and out.num_scheduled_tokens == {"high": 1}


def staggered_requests():
    """Six requests of 6 prompt tokens, one arriving per step, the earliest with the lowest priorities: under
    the priority policy the victim is then often a request scheduled earlier in the same step."""
    return [make_request(str(i), range(10 * i + 1, 10 * i + 7), priority=priority, max_tokens=10)
            for i, priority in enumerate([7, 5, 0, 6, 1, 2])]


@pytest.mark.parametrize("overlapped", [False, True], ids=["stepwise", "overlapped"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_every_request_finishes_and_blocks_return_under_pressure(policy, overlapped):
    """Overlapped: step N+1 is scheduled before step N's tokens are known; victims may have a token in flight."""
    sched = make_scheduler(policy, num_blocks=8, block_size=4)
    finished, preempted = run_until_done(sched, staggered_requests(), max_steps=400 if overlapped else 300,
                                         overlapped=overlapped)
    assert preempted, "7 blocks cannot hold six growing requests"
    assert finished == {str(i): 10 for i in range(6)}
    assert sched.kv_cache_manager.get_num_free_blocks() == 7
