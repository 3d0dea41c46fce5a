"""ModelRunnerOutput: what the model runner computed in one step, and the handle of a step still on the device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from brigade.interfaces.engine_io import LogprobsLists


@dataclass(frozen=True, slots=True)
class RequestFailure:
    """Why one scheduled request got no tokens from a step.

    ``ran`` tells the two cases apart: False when the runner could not run the request and left it out of the
    step (a LoRA adapter whose evicted weights cannot be read again; the scheduler finishes it as aborted),
    True when it ran but failed (a plugin's logits processor raised on it; the scheduler finishes it with
    finish_reason "error" and the engine goes on).
    """

    message: str  # one line; a plugin's failure names the plugin
    ran: bool


@dataclass(slots=True)
class ModelRunnerOutput:
    """What the runner computed: for each scheduled request, its sampled tokens (empty mid-prefill).

    A request with draft tokens gets its accepted drafts then one more token (the target's correction at
    the first rejected draft, or the bonus token after all of them): 1 to k + 1 tokens.
    """

    req_ids: list[str]
    sampled_token_ids: list[list[int]]  # aligned with req_ids
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)  # only requests that asked
    # Per request with prompt_logprobs: one row per prompt token this step scored (the token after each
    # computed position), starting at the token after the chunk's first position.
    prompt_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    # Scheduled requests that failed in this step or could not run in it: request id -> why.
    failures: dict[str, RequestFailure] = field(default_factory=dict)
    # MoE models: decoder layer index -> tokens routed to each expert ([num_experts], global expert ids) since
    # the last step that reported (steps that sample nothing report on the next one); None for dense models.
    expert_tokens: dict[int, list[int]] | None = None

    @classmethod
    def make_empty(cls) -> ModelRunnerOutput:
        return cls([], [])


class AsyncModelRunnerOutput(Protocol):
    """A step launched on the device whose output is not on the host yet (overlapped scheduling; vLLM v1's
    ``AsyncModelRunnerOutput``). The engine core prepares and launches the next step before calling ``get``."""

    def get(self) -> ModelRunnerOutput:
        """Wait for the device, then return the step's output. Called once."""
        ...
