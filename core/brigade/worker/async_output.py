"""A step's output before its samples reach the host, and the samples of steps still in flight (vLLM v1's
asynchronous scheduling).

With overlap the runner returns as soon as a step's work is queued on the device: a ``SampledTokens`` whose
``get()`` waits for the tokens and builds the ``ModelRunnerOutput`` (vLLM v1's ``AsyncModelRunnerOutput``).
It holds no reference to the runner: the runner's ``InFlightSamples`` keeps the last step's samples on the
device for the next step's inputs, and applies each step's tokens to the request states once its ``get()``
has brought them to the host.
"""

from __future__ import annotations

from collections import deque

import torch

from brigade.interfaces import LogprobsLists, ModelRunnerOutput
from brigade.sample.metadata import PendingTokens
from brigade.sample.sampler import SamplerOutput
from brigade.worker.input_batch import StepInputs
from brigade.worker.request_states import RequestStates


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Start copying a device tensor to (pinned) host memory without waiting."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class ReadyOutput:
    """An overlapped step's output that is known at once (nothing was sampled, or drafts were verified);
    ``get()`` returns it, as ``SampledTokens.get()`` does once its tokens arrive."""

    def __init__(self, output: ModelRunnerOutput):
        self.output = output

    def get(self) -> ModelRunnerOutput:
        return self.output


class SampledTokens:
    """One token per sampling request, on its way to the host; ``get()`` waits for them and returns the step's
    ``ModelRunnerOutput`` (the same object on every call). It changes no request state: the runner applies
    ``samples()`` once ``resolved``."""

    def __init__(self, req_ids: list[str], sampling_req_ids: list[str], out: SamplerOutput,
                 num_logprobs: list[int | None], output: ModelRunnerOutput):
        """``num_logprobs``: per sampling request, its ``SamplingParams.logprobs``; ``output``: the step's
        output without samples (failures, prompt logprobs), completed by ``get()``."""
        self.req_ids = req_ids
        self.sampling_req_ids = sampling_req_ids
        self.num_logprobs = num_logprobs
        self.tokens = _to_host(out.sampled_token_ids)
        self.logprobs = None if out.logprobs is None else \
            (_to_host(out.logprobs.token_ids), _to_host(out.logprobs.logprobs), _to_host(out.logprobs.ranks))
        self.event = None
        self._output = output
        # (an MoE model's ExpertCounts, its totals copied before the event below): reported by get()
        self.expert_counts = None
        self._token_list: list[int] | None = None  # the samples, once on the host
        if out.sampled_token_ids.device.type == "cuda":
            self.event = torch.cuda.Event()
            self.event.record()

    @property
    def resolved(self) -> bool:
        """Whether ``get()`` has brought the samples to the host."""
        return self._token_list is not None

    def samples(self) -> list[tuple[str, int]]:
        """(request id, token) per sampling request, once ``resolved``."""
        return list(zip(self.sampling_req_ids, self._token_list))

    def get(self) -> ModelRunnerOutput:
        if self._token_list is not None:
            return self._output
        if self.event is not None:
            self.event.synchronize()
        self._token_list = self.tokens.tolist()
        sampled = {rid: [tok] for rid, tok in zip(self.sampling_req_ids, self._token_list)}
        self._output.req_ids = self.req_ids
        self._output.sampled_token_ids = [sampled.get(r, []) for r in self.req_ids]
        if self.expert_counts is not None:
            counts, snapshot = self.expert_counts
            self._output.expert_tokens = counts.take(snapshot)
        if self.logprobs is not None:
            ids, lps, ranks = (t.tolist() for t in self.logprobs)
            for row, (rid, k) in enumerate(zip(self.sampling_req_ids, self.num_logprobs)):
                if k is not None:
                    self._output.logprobs[rid] = LogprobsLists(token_ids=[ids[row][:k + 1]],
                                                               logprobs=[lps[row][:k + 1]], ranks=[ranks[row]])
        return self._output


class InFlightSamples:
    """The samples of steps launched and not yet applied to the request states.

    The last sampling step's tokens stay on the device (``last``, a row per request in ``rows``): the next
    step's inputs read them there, before they reach the host (``fill_inputs``). Every ``SampledTokens``
    is applied to the states, in step order, once its ``get()`` has run (``apply_resolved``).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.last: torch.Tensor | None = None  # [num_sampled] int64 on the device, the last step's samples
        self.rows: dict[str, int] = {}  # request id -> row of ``last``
        self.unapplied: deque[SampledTokens] = deque()

    def launch(self, out: SamplerOutput, requests: RequestStates, req_ids: list[str], sampling_req_ids: list[str],
               output: ModelRunnerOutput) -> SampledTokens:
        """Keep a step's samples (``out``, a row per sampling request) as the last and return its
        ``SampledTokens``; each sampling request gets one more pending token."""
        self.last = out.sampled_token_ids
        self.rows = {rid: row for row, rid in enumerate(sampling_req_ids)}
        for rid in sampling_req_ids:
            requests[rid].num_pending += 1
        result = SampledTokens(req_ids, sampling_req_ids, out,
                               [requests[rid].sampling.params.logprobs for rid in sampling_req_ids], output)
        self.unapplied.append(result)
        return result

    def pending_for(self, req_ids: list[str], requests: RequestStates) -> PendingTokens | None:
        """The rows' tokens of the step in flight, for sampling that reads earlier output tokens (penalties,
        bad words, min_tokens); None when no row of ``req_ids`` has one. A request has at most one pending token
        (one step is in flight at a time), and it is in ``last``."""
        if self.last is None or not self.unapplied:  # every sampled token is in the states already
            return None
        rows = [self.rows.get(rid) if requests[rid].num_pending else None for rid in req_ids]
        return PendingTokens(self.last, rows) if any(r is not None for r in rows) else None

    def forget_last(self) -> None:
        """No step reads the last samples any more (a verification step emitted its tokens on the host)."""
        self.last, self.rows = None, {}

    def apply_resolved(self, requests: RequestStates) -> None:
        """Append the tokens of every step whose ``get()`` has run, oldest first, to the request states."""
        while self.unapplied and self.unapplied[0].resolved:
            requests.append_samples(self.unapplied.popleft().samples())

    def fill_inputs(self, inputs: StepInputs) -> None:
        """Put the last step's samples, still on the device, into this step's input ids
        (``inputs.pending_rows``)."""
        if not inputs.pending_rows:
            return
        src = [self.rows[rid] for rid in inputs.pending_req_ids]
        if inputs.pending_rows == src == list(range(len(src))):  # steady decode: row i takes sample i
            inputs.input_ids[:len(src)].copy_(self.last[:len(src)])
            return
        index = torch.tensor([inputs.pending_rows, src], dtype=torch.int64)
        if self.device.type == "cuda":
            index = index.pin_memory()
        index = index.to(self.device, non_blocking=True)
        inputs.input_ids[index[0]] = self.last[index[1]]
