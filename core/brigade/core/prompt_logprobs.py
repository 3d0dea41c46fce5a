"""PromptLogprobsLedger: which prompt-logprobs rows each request's client already has."""

from __future__ import annotations

from brigade.interfaces import LogprobsLists, SchedulerOutput


class PromptLogprobsLedger:
    """Drops prompt-logprobs rows a client already had: a preempted request recomputes its prompt from the
    start, and its client must see each prompt token's row once.

    Invariant: for each request, the rows of prompt tokens 1..``num_sent[request_id]`` are delivered (token 0
    has no row: nothing precedes it).
    """

    def __init__(self) -> None:
        self.num_sent: dict[str, int] = {}  # request id -> prompt tokens whose row is delivered

    def take_new(self, request_id: str, first_token: int, lists: LogprobsLists) -> LogprobsLists | None:
        """The rows of ``lists`` not yet delivered, or None when all were; ``lists`` holds one row per prompt
        token from ``first_token`` (the token after the step's first computed position) on."""
        sent = self.num_sent.get(request_id, 0)
        skip = max(0, sent + 1 - first_token)
        self.num_sent[request_id] = max(sent, first_token - 1 + len(lists.ranks))
        if skip >= len(lists.ranks):
            return None
        return LogprobsLists(lists.token_ids[skip:], lists.logprobs[skip:], lists.ranks[skip:])

    def forget(self, request_id: str) -> None:
        """The request finished."""
        self.num_sent.pop(request_id, None)


def scheduled_num_computed(scheduler_output: SchedulerOutput, request_id: str) -> int:
    """The request's computed tokens when ``scheduler_output`` was planned (before that step ran). A linear scan of
    the step's requests: called only for the few requests that asked for prompt logprobs, in their prefill.

    Raises:
        KeyError: the request is not in the step.
    """
    for new in scheduler_output.scheduled_new_reqs:
        if new.req_id == request_id:
            return new.num_computed_tokens
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens):
        if req_id == request_id:
            return num_computed
    raise KeyError(f"request {request_id} is not in the step")
