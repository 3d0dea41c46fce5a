"""GrammarGate: the scheduler's side of structured output: a request waits while its grammar compiles, the
requests that sample under a grammar get a bitmask row, and each step's tokens advance their matcher.

The grammar work itself (compiling, bitmasks, matchers) is ``brigade.structured_output``'s
``StructuredOutputManager``; this gate only turns it into scheduling decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import numpy as np

from brigade.core.request import Request
from brigade.sampling_params import StructuredOutputsParams


class GrammarVerdict(enum.Enum):
    """What a request's grammar says after the step's tokens."""

    CONTINUE = 0  # more tokens may follow
    VIOLATED = 1  # a token the grammar does not allow (another mask left none it allows): finish as aborted
    TERMINATED = 2  # the grammar accepted its stop token: nothing more may be generated, finish as stopped


VIOLATION_REASON = "the sampled token violates the output grammar"


class GrammarGate:
    """Decides when a constrained request may run and which scheduled requests need a bitmask row.

    Contract: keyed by request id; answers from the manager's state only (never the scheduler's queues).
    Without a manager (structured output off) no request is held back, none needs a bitmask, and every
    verdict is CONTINUE. Requests without a grammar pass through every call untouched.
    """

    def __init__(self, manager=None):
        self.manager = manager  # a brigade.structured_output StructuredOutputManager, or None
        self.enabled = manager is not None

    def add_request(self, request_id: str, params: StructuredOutputsParams | None) -> None:
        """Start compiling a new request's grammar (never blocks); nothing when it has none."""
        if self.manager is not None and params is not None:
            self.manager.add_request(request_id, params)

    def remove_request(self, request_id: str) -> None:
        """Forget a finished request."""
        if self.manager is not None:
            self.manager.remove_request(request_id)

    def is_compiling(self, request_id: str) -> bool:
        """True while the request's grammar is still compiling: it may not be admitted yet."""
        return self.manager is not None and self.manager.is_waiting_for_grammar(request_id)

    def take_failure(self, request_id: str) -> str | None:
        """Why the request's grammar failed to compile (then forgotten: the request must be finished as
        aborted, with this as its stop reason), or None."""
        return self.manager.take_failure(request_id) if self.manager is not None else None

    def bitmask_req_ids(self, scheduled: Iterable[tuple[Request, int]]) -> list[str]:
        """The constrained requests among ``scheduled`` (request, tokens scheduled this step) that sample this
        step: their computed tokens reach ``num_tokens``. Called before the step's counters move; such
        requests are never overlap-safe, so no token of theirs is in flight."""
        manager = self.manager
        if manager is None:
            return []
        return [request.request_id for request, num_new in scheduled if manager.has_request(request.request_id)
                and request.num_computed_tokens + num_new == request.num_tokens]

    def bitmask(self, request_ids: list[str]) -> np.ndarray:
        """The allowed next tokens of each request, one row per id in order.

        Returns: [len(request_ids), ceil(vocab_size / 32)] int32; bit j of word w allows token 32w + j.
        """
        return self.manager.grammar_bitmask(request_ids)

    def advance(self, request_id: str, token_ids: list[int]) -> GrammarVerdict:
        """Feed an unfinished request's newly kept tokens to its matcher; the verdict says whether it ends."""
        manager = self.manager
        if manager is None or not manager.has_request(request_id):
            return GrammarVerdict.CONTINUE
        if not manager.accept_tokens(request_id, token_ids):
            return GrammarVerdict.VIOLATED
        if manager.is_terminated(request_id):
            return GrammarVerdict.TERMINATED
        return GrammarVerdict.CONTINUE
