"""RequestStates, the runner's copy of the scheduled requests, on the CPU in milliseconds: the scheduler's diffs
(new, running, finished, preempted), the step's batch order, and the tokens applied after sampling, verification
or from the last pipeline stage."""

from __future__ import annotations

import torch

from brigade.interfaces import CachedRequestData, NewRequestData, SchedulerOutput
from brigade.sampling_params import SamplingParams
from brigade.worker.request_states import RequestStates


def new_request(req_id: str, token_ids: list[int], block_ids: list[int], *, num_prompt: int | None = None,
                num_computed: int = 0, **params) -> NewRequestData:
    return NewRequestData(req_id=req_id, token_ids=token_ids,
                          num_prompt_tokens=len(token_ids) if num_prompt is None else num_prompt,
                          sampling_params=SamplingParams(temperature=0, **params), eos_token_id=0,
                          block_ids=(block_ids,), num_computed_tokens=num_computed)


def output(new=(), cached: CachedRequestData | None = None, finished=(), preempted=()) -> SchedulerOutput:
    out = SchedulerOutput.make_empty()
    out.scheduled_new_reqs = list(new)
    out.scheduled_cached_reqs = cached or CachedRequestData.make_empty()
    out.finished_req_ids, out.preempted_req_ids = set(finished), set(preempted)
    return out


def states_with(*requests: NewRequestData) -> RequestStates:
    states = RequestStates(torch.device("cpu"))
    states.update(output(new=requests))
    return states


def test_new_requests_are_built_whole():
    states = states_with(new_request("a", [1, 2, 3, 9], [4, 5], num_prompt=3, num_computed=2))
    a = states["a"]
    assert (a.token_ids, a.num_prompt_tokens, a.block_ids, a.num_computed_tokens) == ([1, 2, 3, 9], 3, ([4, 5],), 2)
    assert a.sampling.prompt_token_ids == [1, 2, 3] and a.sampling.output_token_ids == [9]
    assert a.sampling.generator is None and a.num_pending == 0


def test_a_seeded_request_gets_its_own_generator():
    states = states_with(new_request("s", [1], [1], seed=7), new_request("t", [1], [2], seed=7))
    first, second = states["s"].sampling.generator, states["t"].sampling.generator
    assert first is not None and first is not second
    assert torch.rand(1, generator=first).item() == torch.rand(1, generator=second).item()


def test_running_requests_grow_their_blocks_and_computed_count():
    states = states_with(new_request("a", [1, 2, 3, 4, 5], [1, 2]))
    states.update(output(cached=CachedRequestData(req_ids=["a"], new_block_ids=[([6],)], num_computed_tokens=[5])))
    assert states["a"].block_ids == ([1, 2, 6],) and states["a"].num_computed_tokens == 5


def test_finished_and_preempted_requests_are_dropped():
    states = states_with(new_request("a", [1], [1]), new_request("b", [2], [2]), new_request("c", [3], [3]))
    states.update(output(finished=["a", "gone"], preempted=["b"]))
    assert list(states) == ["c"]


def test_a_preempted_request_comes_back_rebuilt_with_its_outputs():
    states = states_with(new_request("a", [1, 2], [1]))
    states.update(output(preempted=["a"]))
    states.update(output(new=[new_request("a", [1, 2, 8, 9], [3, 4], num_prompt=2)]))
    assert states["a"].token_ids == [1, 2, 8, 9] and states["a"].sampling.output_token_ids == [8, 9]
    assert states["a"].block_ids == ([3, 4],)


def test_the_batch_puts_decodes_first_and_advance_counts_the_tokens():
    states = states_with(new_request("p", [1, 2, 3, 4], [1]), new_request("d", [5, 6], [2], num_computed=1))
    batch = states.batch({"p": 4, "d": 1}, {})
    assert batch.req_ids == ["d", "p"] and batch.num_scheduled == [1, 4] and batch.num_tokens == 5
    assert batch.drafts is None and not batch.want_prompt_logprobs
    states.advance(batch)
    assert states["d"].num_computed_tokens == 2 and states["p"].num_computed_tokens == 4


def test_the_batch_carries_drafts_and_prompt_logprobs():
    states = states_with(new_request("a", [1, 2, 3], [1], prompt_logprobs=1), new_request("b", [4], [2]))
    batch = states.batch({"a": 3, "b": 1}, {"b": [7, 8]})
    assert batch.want_prompt_logprobs and batch.drafts == [[7, 8], []]


def test_samples_apply_only_to_requests_waiting_for_them():
    states = states_with(new_request("a", [1, 2], [1]), new_request("b", [3], [2]))
    states["a"].num_pending = 1
    states.append_samples([("a", 10), ("b", 11), ("gone", 12)])
    assert states["a"].token_ids == [1, 2, 10] and states["a"].num_pending == 0
    assert states["a"].sampling.output_token_ids == [10]
    assert states["b"].token_ids == [3]  # nothing pending: rebuilt after a preemption, say


def test_verified_drafts_roll_the_computed_count_back_over_the_rejected_ones():
    states = states_with(new_request("a", [1, 2, 3], [1], num_computed=2))
    states["a"].num_computed_tokens = 6  # the step computed the last token and 3 drafts
    states.append_verified("a", [21, 22], num_drafts=3)  # one draft accepted, then one more token
    assert states["a"].token_ids == [1, 2, 3, 21, 22] and states["a"].num_computed_tokens == 4


def test_a_stage_before_the_last_learns_the_sampled_tokens():
    """Pipeline parallelism: a stage that does not sample appends what the scheduler says was sampled."""
    states = states_with(new_request("a", [1, 2, 3], [1]))
    states.update(output(cached=CachedRequestData(req_ids=["a"], new_block_ids=[([],)], num_computed_tokens=[3],
                                                  new_token_ids=[[40]])))
    assert states["a"].token_ids == [1, 2, 3, 40] and states["a"].sampling.output_token_ids == [40]
    states.append_unseen(states["a"], [40])  # already there: nothing appended twice
    assert states["a"].token_ids == [1, 2, 3, 40]


def test_unverified_drafts_are_kept_as_far_as_the_last_stage_accepted():
    states = states_with(new_request("a", [1, 2, 3, 4], [1], num_computed=3))
    state = states["a"]
    state.unverified_drafts = [50, 51, 52]
    state.num_computed_tokens = 7  # the step ran the last token and three drafts
    states.update(output(cached=CachedRequestData(req_ids=["a"], new_block_ids=[([],)], num_computed_tokens=[6],
                                                  new_token_ids=[[60]])))
    assert state.unverified_drafts is None and state.num_computed_tokens == 6
    assert state.token_ids == [1, 2, 3, 4, 50, 51, 60]  # two drafts accepted, then the sampled token


def test_each_kv_cache_group_keeps_its_own_block_table():
    """A model with several KV cache groups (full attention and a sliding window): one table per group."""
    request = new_request("a", [1, 2, 3, 4, 5], [])
    request.block_ids = ([1, 2], [7, 8])
    states = states_with(request)
    states.update(output(cached=CachedRequestData(req_ids=["a"], new_block_ids=[([3], [9])],
                                                  num_computed_tokens=[5])))
    assert states["a"].block_ids == ([1, 2, 3], [7, 8, 9])
