"""DraftVerifier: speculative decoding's verification of a step's draft tokens.

A request with k drafts ran [last token, d1..dk] and has 1 + k logits rows (``build_step_inputs``); the
rejection sampler keeps the drafts the target model accepts and emits one more token. Never overlapped: the
scheduler needs the accepted tokens to propose the next drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from brigade.interfaces import LogprobsLists, SchedulerOutput
from brigade.sample.logprobs import LogprobsTensors
from brigade.sample.metadata import SamplingRequestState, build_sampling_metadata
from brigade.sample.rejection_sampler import RejectionSampler
from brigade.worker.request_states import RequestStates
from brigade.worker.step_sampler import grammar_bitmask, row_errors


@dataclass(slots=True)
class Verification:
    """What a verification step emitted, per sampling request (in batch order)."""

    tokens: dict[str, list[int]]  # accepted drafts then one more (1 to k + 1 ids)
    num_drafts: dict[str, int]
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)  # requests that asked
    errors: dict[str, str] = field(default_factory=dict)  # a plugin's logits processor failed: id -> why


class DraftVerifier:
    """Verifies drafts with the ``RejectionSampler`` (over the runner's ``Sampler``)."""

    def __init__(self, rejection_sampler: RejectionSampler, device: torch.device):
        self.rejection_sampler = rejection_sampler
        self.device = device

    def __call__(self, requests: RequestStates, sampling_req_ids: list[str], logits: torch.Tensor,
                 scheduler_output: SchedulerOutput) -> Verification:
        """Verify the drafts of ``sampling_req_ids`` (``scheduler_output.scheduled_spec_decode_tokens``) on
        ``logits``: 1 + k rows per request with k drafts, in order. Reads the states, changes none."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        drafts_per_req = [spec.get(rid, []) for rid in sampling_req_ids]
        rows, row_req_ids = self._rows(requests, sampling_req_ids, drafts_per_req)
        metadata = build_sampling_metadata(rows, vocab_size=logits.shape[-1], device=self.device)
        # Requests with a grammar get no drafts (Scheduler._propose): their single row takes their mask.
        metadata.grammar_bitmask = grammar_bitmask(scheduler_output, row_req_ids, self.device)
        out = self.rejection_sampler(logits, metadata, drafts_per_req)
        num_logprobs = [requests[rid].sampling.params.logprobs for rid in sampling_req_ids]
        return Verification(tokens=dict(zip(sampling_req_ids, out.token_ids)),
                            num_drafts={rid: len(d) for rid, d in zip(sampling_req_ids, drafts_per_req)},
                            logprobs=_emitted_logprobs(sampling_req_ids, out.token_ids, num_logprobs, out.logprobs),
                            errors=row_errors(row_req_ids, metadata.processor_errors))

    @staticmethod
    def _rows(requests: RequestStates, sampling_req_ids: list[str],
              drafts_per_req: list[list[int]]) -> tuple[list[SamplingRequestState], list[str]]:
        """The sampling rows (1 + k a request; row j sees the first j drafts as output, for penalties and
        min_tokens) and the request of each row."""
        rows: list[SamplingRequestState] = []
        row_req_ids: list[str] = []
        for rid, drafts in zip(sampling_req_ids, drafts_per_req):
            sampling = requests[rid].sampling
            rows.append(sampling)
            for j in range(1, len(drafts) + 1):
                rows.append(SamplingRequestState(
                    params=sampling.params, prompt_token_ids=sampling.prompt_token_ids,
                    output_token_ids=sampling.output_token_ids + drafts[:j], generator=sampling.generator,
                    eos_token_id=sampling.eos_token_id))
            row_req_ids += [rid] * (len(drafts) + 1)
        return rows, row_req_ids


def _emitted_logprobs(req_ids: list[str], tokens: list[list[int]], num_logprobs: list[int | None],
                      logprobs: LogprobsTensors | None) -> dict[str, LogprobsLists]:
    """Per request that asked (``num_logprobs`` not None), the logprobs of its emitted tokens: the rejection
    sampler's rows, request after request, cut to its top ``num_logprobs``."""
    if logprobs is None:
        return {}
    ids, lps, ranks = (t.tolist() for t in (logprobs.token_ids, logprobs.logprobs, logprobs.ranks))
    out: dict[str, LogprobsLists] = {}
    first = 0
    for rid, emitted, k in zip(req_ids, tokens, num_logprobs):
        span = range(first, first + len(emitted))
        if k is not None:
            out[rid] = LogprobsLists(token_ids=[ids[i][:k + 1] for i in span], logprobs=[lps[i][:k + 1] for i in span],
                                     ranks=[ranks[i] for i in span])
        first += len(emitted)
    return out
