"""RequestOutput and CompletionOutput: what LLM.generate and the server hand back to users."""

from __future__ import annotations

from dataclasses import dataclass, field

from brigade.interfaces.lora_request import LoRARequest


@dataclass(slots=True)
class Logprob:
    """One candidate token's log-probability (from the raw logits), its rank (1 = top) and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the chosen token is always present).
SampleLogprobs = list[dict[int, Logprob]]


@dataclass(slots=True)
class CompletionOutput:
    """One of the n sequences of a request.

    text and token_ids are cumulative or deltas depending on SamplingParams.output_kind.
    finish_reason is None while running, else "stop", "length", "abort" or "error".
    stop_reason is the stop string or stop token id that ended it, or None (EOS or length).
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """The state of one request after a step: prompt, the n outputs, and whether all have finished."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    prompt_logprobs: SampleLogprobs | None = None
    metrics: dict = field(default_factory=dict)
    lora_request: LoRARequest | None = None  # the adapter it ran on (offline ``LLM``), as in vLLM
