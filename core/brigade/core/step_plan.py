"""StepPlan: the step the scheduler is planning: the token budget left and what is scheduled so far."""

from __future__ import annotations

from dataclasses import dataclass, field

from brigade.core.request import Request
from brigade.interfaces import CachedRequestData, NewRequestData


@dataclass(slots=True)
class StepPlan:
    """The step being planned, in scheduling order: running requests first, then admitted ones.

    Invariant: ``budget`` + the sum of ``num_scheduled`` is the step's token budget; every request in ``cached``,
    ``new_reqs`` and ``spec_tokens`` is in ``num_scheduled``. Preempted requests are in ``preempted_req_ids`` only.
    """

    budget: int  # tokens left of max_num_batched_tokens
    num_scheduled: dict[str, int] = field(default_factory=dict)  # request id -> new tokens this step
    cached: CachedRequestData = field(default_factory=CachedRequestData.make_empty)  # running ones the runner holds
    new_reqs: list[NewRequestData] = field(default_factory=list)
    preempted_req_ids: set[str] = field(default_factory=set)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)  # request id -> drafts it runs

    def add_running(self, request: Request, num_new: int, new_block_ids: tuple[list[int], ...],
                    drafts: list[int]) -> None:
        """Schedule a running request for ``num_new`` tokens (drafts included), with the blocks it got (per KV
        cache group)."""
        self.num_scheduled[request.request_id] = num_new
        self.budget -= num_new
        self.cached.req_ids.append(request.request_id)
        self.cached.new_block_ids.append(new_block_ids)
        self.cached.num_computed_tokens.append(request.num_computed_tokens)
        if drafts:
            self.spec_tokens[request.request_id] = drafts

    def add_new(self, data: NewRequestData, num_new: int) -> None:
        """Schedule an admitted request (new, or resumed after preemption) for ``num_new`` tokens."""
        self.num_scheduled[data.req_id] = num_new
        self.budget -= num_new
        self.new_reqs.append(data)

    def drop(self, request_id: str) -> None:
        """Take back a running request scheduled earlier in this step (it was preempted): its tokens return
        to the budget. Only the priority policy preempts such a request, so the linear search is rare."""
        if request_id not in self.num_scheduled:
            return  # passed over: it had no token to schedule
        self.budget += self.num_scheduled.pop(request_id)
        i = self.cached.req_ids.index(request_id)
        del self.cached.req_ids[i], self.cached.new_block_ids[i], self.cached.num_computed_tokens[i]
        if self.cached.new_token_ids:
            del self.cached.new_token_ids[i]
        self.spec_tokens.pop(request_id, None)
