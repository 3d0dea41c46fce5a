"""RequestGrammar: one request's grammar state machine, advanced on the CPU by accepted tokens.

The matcher's state is the set of tokens it has accepted, so it stays valid across preemption: a
recomputed request re-runs its prompt and outputs through the model but never re-feeds the matcher.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger("brigade.structured_output")


class RequestGrammar:
    """Wraps an xgrammar GrammarMatcher for one request.

    Invariant: ``num_accepted`` equals the number of output tokens the matcher has consumed, i.e. every
    output token of the request once ``accept`` has been called for each step.

    Args:
        compiled: an xgrammar CompiledGrammar for the model's vocabulary.
    """

    __slots__ = ("matcher", "num_accepted")

    def __init__(self, compiled):
        import xgrammar as xgr

        # Stop tokens come from the compiled grammar's TokenizerInfo (the model's EOS): they are allowed
        # exactly when the grammar can end, and accepting one terminates the matcher.
        self.matcher = xgr.GrammarMatcher(compiled)
        self.num_accepted = 0

    def accept(self, token_ids: list[int]) -> bool:
        """Advance by the step's sampled tokens. Returns False (state unchanged past the bad token) when the
        grammar rejects one, which only happens if another mask emptied the allowed set."""
        for token_id in token_ids:
            if not self.matcher.accept_token(token_id):
                return False
            self.num_accepted += 1
        return True

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` ([N, ceil(V/32)] int32, bit set = allowed)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        """True once the matcher accepted a stop token (the grammar is complete and closed)."""
        return self.matcher.is_terminated()
