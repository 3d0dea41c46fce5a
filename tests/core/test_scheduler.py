"""Scheduler: token budget, chunked prefill mixed with decodes, preemption, prefix hits."""

from scheduler_steps import EOS, make_request, make_scheduler, run_step, run_until_done

from brigade.core.request import RequestStatus


def test_chunked_prefill_mixes_with_decode_within_budget():
    sched = make_scheduler(budget=10)
    sched.add_request(make_request("a", range(1, 5)))
    run_step(sched)  # a: prefill of 4 -> first token
    sched.add_request(make_request("b", range(10, 40)))  # 30 tokens, needs 3+ chunks
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 9}, "decode of a and a 9-token chunk of b share the step"
    assert out.total_num_scheduled_tokens <= 10
    out, outputs = run_step(sched)
    assert out.num_scheduled_tokens["b"] == 9 and all(o.request_id != "b" for o in outputs.outputs)


def test_preemption_frees_last_running_request_and_it_resumes():
    # 5 usable blocks of 4 tokens = 20 slots.
    sched = make_scheduler(num_blocks=6, block_size=4, budget=64)
    sched.add_request(make_request("a", range(1, 8), max_tokens=8))  # 7 tokens -> 2 blocks
    sched.add_request(make_request("b", range(20, 27), max_tokens=8))  # 2 blocks
    run_step(sched)
    assert sched.kv_cache_manager.get_num_free_blocks() == 1
    preempted = False
    for _ in range(40):
        out, _ = run_step(sched)
        if out.preempted_req_ids:
            assert out.preempted_req_ids == {"b"}, "the last running request goes first"
            assert sched.requests["b"].status == RequestStatus.PREEMPTED
            assert sched.requests["b"].num_computed_tokens == 0
            preempted = True
        if not sched.requests:
            break
    assert preempted
    assert not sched.requests, "both requests finish after the preemption"
    assert sched.kv_cache_manager.get_num_free_blocks() == 5


def test_prefix_hit_capped_below_num_tokens():
    # A full hit must leave one token to compute, or there would be no logits.
    sched = make_scheduler(block_size=4)
    prompt = list(range(1, 9))  # exactly two blocks
    sched.add_request(make_request("a", prompt, max_tokens=1))
    run_step(sched)
    sched.add_request(make_request("b", prompt, max_tokens=1))
    out, _ = run_step(sched)
    new = out.scheduled_new_reqs[0]
    assert new.num_computed_tokens == 4, "only the first block may hit; the last token must be computed"
    assert out.num_scheduled_tokens["b"] == 4


def test_stop_token_and_length_and_abort_free_blocks():
    sched = make_scheduler()
    sched.add_request(make_request("eos", [1, 2, 3], max_tokens=10))
    sched.add_request(make_request("len", [4, 5, 6], max_tokens=2, ignore_eos=True))
    sched.add_request(make_request("abort", [7, 8, 9], max_tokens=10))
    _, outputs = run_step(sched, token=EOS)
    reasons = {o.request_id: o.finish_reason for o in outputs.outputs}
    assert str(reasons["eos"]) == "stop"
    sched.finish_requests(["abort"], RequestStatus.FINISHED_ABORTED)
    _, outputs = run_step(sched)
    assert str(outputs.outputs[0].finish_reason) == "length"
    assert not sched.requests and sched.kv_cache_manager.get_num_free_blocks() == 63


def test_min_tokens_ignores_eos_until_reached():
    sched = make_scheduler()
    sched.add_request(make_request("a", [1, 2], max_tokens=5, min_tokens=2))
    _, outputs = run_step(sched, token=EOS)
    assert outputs.outputs[0].finish_reason is None
    _, outputs = run_step(sched, token=EOS)
    assert str(outputs.outputs[0].finish_reason) == "stop"


def test_max_num_seqs_limits_running():
    sched = make_scheduler(max_seqs=2)
    for i in range(4):
        sched.add_request(make_request(str(i), [1, 2, 3]))
    out, _ = run_step(sched)
    assert len(out.scheduled_new_reqs) == 2 and len(sched.waiting) == 2


def test_priority_policy_orders_waiting():
    sched = make_scheduler(policy="priority", max_seqs=1, budget=64, max_model_len=64, num_blocks=32)
    low = make_request("low", [1, 2])
    low.priority = 5
    high = make_request("high", [3, 4])
    high.priority = -1
    sched.add_request(low)
    sched.add_request(high)
    out, _ = run_step(sched)
    assert [r.req_id for r in out.scheduled_new_reqs] == ["high"]


def test_overlapped_scheduling_with_placeholders_and_preemption():
    """Step N+1 is scheduled before step N's tokens are known (asynchronous scheduling).

    Every request must still finish with exactly max_tokens tokens, blocks must all come back, and a
    request preempted while its token is in flight must resume only after that token arrives.
    """
    sched = make_scheduler(num_blocks=7, block_size=4, budget=64)
    for i in range(3):
        sched.add_request(make_request(str(i), range(10 * i + 1, 10 * i + 7), max_tokens=10, ignore_eos=True))
    finished, preempted = run_until_done(sched, [], max_steps=200, overlapped=True)
    assert preempted, "7 blocks cannot hold three growing requests"
    assert finished == {"0": 10, "1": 10, "2": 10}
    assert sched.kv_cache_manager.get_num_free_blocks() == 6
