"""RequestStates: the runner's copy of every scheduled request, kept in step with the scheduler.

The scheduler sends diffs (``SchedulerOutput``: new requests whole, running ones as new blocks and a computed
count, finished and preempted ids); the runner applies them here before planning a step, and applies the
tokens it samples once they reach the host (``async_output.InFlightSamples``) or once drafts are verified.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from brigade.interfaces import SchedulerOutput
from brigade.sample.metadata import SamplingRequestState
from brigade.worker.input_batch import CachedRequestState


@dataclass(slots=True)
class StepBatch:
    """The requests one step runs, in batch order (decodes first: the attention metadata splits the batch
    by one count)."""

    req_ids: list[str]
    states: list[CachedRequestState]  # same order
    num_scheduled: list[int]  # new tokens of each request this step
    drafts: list[list[int]] | None  # draft tokens per request (speculative decoding), None when no request has
    want_prompt_logprobs: bool  # some request scores prompt tokens this step

    @property
    def num_tokens(self) -> int:
        return sum(self.num_scheduled)


class RequestStates(dict[str, CachedRequestState]):
    """Request id -> ``CachedRequestState``, for every request the scheduler runs (not the waiting ones).

    Invariant: a state's ``num_pending`` counts the tokens sampled for it that are not yet in its
    ``token_ids`` (still on the device, or on the host but not yet applied).
    """

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device  # where seeded requests' generators live

    def update(self, scheduler_output: SchedulerOutput) -> None:
        """Drop finished and preempted requests, add the new ones, extend the running ones' blocks (each KV cache
        group's table; a sliding-window group's keeps the ids of blocks the scheduler freed once out of the
        window: the attention kernels never read them)."""
        for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
            self.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            token_ids = list(new.token_ids)
            sampling = SamplingRequestState(params=params, prompt_token_ids=token_ids[:new.num_prompt_tokens],
                                            output_token_ids=token_ids[new.num_prompt_tokens:],
                                            generator=generator, eos_token_id=new.eos_token_id)
            self[new.req_id] = CachedRequestState(
                req_id=new.req_id, token_ids=token_ids, num_prompt_tokens=new.num_prompt_tokens,
                block_ids=tuple(list(ids) for ids in new.block_ids), num_computed_tokens=new.num_computed_tokens,
                sampling=sampling, lora_int_id=new.lora_int_id)
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                    cached.num_computed_tokens):
            state = self[req_id]
            for ids, new_ids in zip(state.block_ids, new_blocks):  # one list per KV cache group
                ids.extend(new_ids)
            if state.unverified_drafts is not None:
                self.apply_accepted_drafts(state, num_computed)
            state.num_computed_tokens = num_computed
        for req_id, tokens in zip(cached.req_ids, cached.new_token_ids):  # pipeline parallelism only
            self.append_unseen(self[req_id], tokens)

    @staticmethod
    def apply_accepted_drafts(state: CachedRequestState, num_computed: int) -> None:
        """On a pipeline stage before the last: append the drafts of its last step that the last stage accepted,
        counted from the scheduler's ``num_computed`` (it rolled back over the rejected ones, as
        ``append_verified`` does), before ``append_unseen`` appends the token sampled after them."""
        drafts, state.unverified_drafts = state.unverified_drafts, None
        num_accepted = len(drafts) - (state.num_computed_tokens - num_computed)
        accepted = drafts[:max(num_accepted, 0)]
        state.token_ids.extend(accepted)
        state.sampling.output_token_ids.extend(accepted)

    @staticmethod
    def append_unseen(state: CachedRequestState, tokens: list[int]) -> None:
        """Append what the runner lacks of a request's uncomputed output ``tokens`` (a pipeline stage that does
        not sample lacks them all; the last stage, which sampled them, none)."""
        missing = state.num_computed_tokens + len(tokens) - len(state.token_ids) - state.num_pending
        if missing > 0:
            new = tokens[len(tokens) - missing:]
            state.token_ids.extend(new)
            state.sampling.output_token_ids.extend(new)

    def batch(self, num_scheduled: dict[str, int], spec_tokens: dict[str, list[int]]) -> StepBatch:
        """The step's ``StepBatch`` for the requests of ``num_scheduled`` (decodes first), with their drafts."""
        order = sorted(num_scheduled, key=lambda rid: num_scheduled[rid] != 1)
        states = [self[rid] for rid in order]
        want_prompt_logprobs = any(s.sampling.params.prompt_logprobs is not None
                                   and s.num_computed_tokens < s.num_prompt_tokens - 1 for s in states)
        return StepBatch(req_ids=order, states=states, num_scheduled=[num_scheduled[rid] for rid in order],
                         drafts=[spec_tokens.get(rid, []) for rid in order] if spec_tokens else None,
                         want_prompt_logprobs=want_prompt_logprobs)

    def advance(self, batch: StepBatch) -> None:
        """Count the step's tokens as computed (their KV is now in the cache)."""
        for state, n in zip(batch.states, batch.num_scheduled):
            state.num_computed_tokens += n

    def append_samples(self, samples: Iterable[tuple[str, int]]) -> None:
        """Apply (request id, token) samples of a step that reached the host to the states still waiting for
        them; a request gone, or rebuilt after a preemption (nothing pending), is skipped."""
        for rid, tok in samples:
            state = self.get(rid)
            if state is not None and state.num_pending:
                state.token_ids.append(tok)
                state.sampling.output_token_ids.append(tok)
                state.num_pending -= 1

    def append_verified(self, req_id: str, tokens: list[int], num_drafts: int) -> None:
        """Apply a verification step's emitted tokens (accepted drafts then one more) and roll
        ``num_computed_tokens`` back over the rejected drafts, as the scheduler does."""
        state = self[req_id]
        state.token_ids.extend(tokens)
        state.sampling.output_token_ids.extend(tokens)
        state.num_computed_tokens -= num_drafts - (len(tokens) - 1)
