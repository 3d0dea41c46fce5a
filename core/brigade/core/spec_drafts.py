"""SpecDrafts: the scheduler's side of speculative decoding (vLLM v1's ``ngram`` method): which draft tokens
run, the next step's drafts, and the acceptance counters.

After a step the scheduler asks ``propose`` for each running request's drafts (n-gram lookup over prompt +
output, ``brigade.spec_decode.NgramProposer``) and keeps them in ``Request.spec_token_ids``. The next
``schedule`` gives a decoding request with drafts 1 + k tokens (``schedulable``) and KV slots for all of them,
and sends the drafts down in ``SchedulerOutput.scheduled_spec_decode_tokens``. The runner returns the accepted
drafts plus one token; ``num_rejected`` says how far ``num_computed_tokens`` rolls back (the rejected drafts'
KV slots are simply overwritten later). Drafts are never in ``all_token_ids``, so their block hashes are never
published and the prefix cache never holds a rejected token.
"""

from __future__ import annotations

from brigade.config import SpeculativeConfig
from brigade.core.request import Request
from brigade.interfaces import SpecDecodingStats
from brigade.spec_decode import NgramProposer


class SpecDrafts:
    """Decides which drafts run and proposes the next ones; counts drafted and accepted tokens.

    Contract: reads requests (their tokens, ``max_tokens``, ``spec_token_ids``) and returns drafts and
    counts; never changes a request or the scheduler's queues. Disabled (no speculative config): proposes
    nothing, so ``schedulable`` is always empty, and ``take_stats`` returns None.
    """

    def __init__(self, speculative_config: SpeculativeConfig | None, max_model_len: int):
        self.proposer = NgramProposer.from_config(speculative_config) if speculative_config is not None else None
        self.enabled = self.proposer is not None
        self.num_spec_tokens = speculative_config.num_speculative_tokens if speculative_config is not None else 0
        self.max_model_len = max_model_len
        # Since start (tests, bench): drafts (steps of a request with drafts), draft tokens, accepted tokens.
        self.totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self._reset_step_counts()

    def _room(self, request: Request) -> int:
        """Drafts that fit before ``max_tokens`` and ``max_model_len``: one token of the up to k + 1 a step
        yields is not a draft."""
        return min(request.max_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens) - 1

    def schedulable(self, request: Request, token_limit: int) -> list[int]:
        """The request's drafts that may run this step.

        Only a decode with its last token known runs drafts. ``token_limit`` is the most tokens the request
        may be scheduled this step (the budget left, and the long-prefill threshold); with the decode token
        the drafts must fit it, and the up to k + 1 tokens the step yields overrun neither ``max_tokens``
        nor ``max_model_len``.
        """
        drafts = request.spec_token_ids
        if not drafts or request.num_output_placeholders or request.num_tokens - request.num_computed_tokens != 1:
            return []
        return drafts[:max(0, min(self._room(request), token_limit - 1))]

    def propose(self, request: Request) -> list[int]:
        """Draft tokens for a running request's next step (n-gram lookup over prompt + output); empty when
        disabled and for requests with a grammar: their next tokens' masks depend on each accepted token
        (vLLM checks drafts against the grammar; Brigade does not speculate for them)."""
        if self.proposer is None or request.sampling_params.structured_outputs is not None:
            return []
        room = self._room(request)
        return self.proposer.propose(request.all_token_ids, room) if room > 0 else []

    def num_rejected(self, num_drafts: int, num_tokens: int) -> int:
        """A step ran ``num_drafts`` drafts and returned ``num_tokens`` tokens (the accepted drafts plus one):
        count them, and return how many drafts were rejected (``num_computed_tokens`` rolls back by that)."""
        num_accepted = num_tokens - 1
        self._num_drafts += 1
        self._num_draft_tokens += num_drafts
        self._num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self._accepted_per_pos[pos] += 1
        self.totals["num_drafts"] += 1
        self.totals["num_draft_tokens"] += num_drafts
        self.totals["num_accepted_tokens"] += num_accepted
        return num_drafts - num_accepted

    def take_stats(self) -> SpecDecodingStats | None:
        """The counters since the last call (then reset), or None when disabled."""
        if self.proposer is None:
            return None
        stats = SpecDecodingStats(num_spec_tokens=self.num_spec_tokens, num_drafts=self._num_drafts,
                                  num_draft_tokens=self._num_draft_tokens,
                                  num_accepted_tokens=self._num_accepted_tokens,
                                  num_accepted_tokens_per_pos=self._accepted_per_pos)
        self._reset_step_counts()
        return stats

    def _reset_step_counts(self) -> None:
        self._num_drafts = self._num_draft_tokens = self._num_accepted_tokens = 0
        self._accepted_per_pos = [0] * self.num_spec_tokens
