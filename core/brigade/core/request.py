"""Request: the EngineCore's record of one request, with vLLM v1's single model of token accounting.

There is no prefill or decode phase: each step moves ``num_computed_tokens`` towards ``num_tokens``.
``num_tokens`` counts prompt plus output tokens; the request is "decoding" exactly when
one token remains to compute.
"""

from __future__ import annotations

import enum

from brigade.interfaces import EngineCoreRequest, FinishReason
from brigade.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Where a request is in the scheduler. Values above PREEMPTED are finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6  # the request failed in the engine (a plugin's logits processor raised); the engine goes on

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def finish_reason(status: RequestStatus) -> FinishReason | None:
        return {RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
                RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
                RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
                RequestStatus.FINISHED_ERROR: FinishReason.ERROR}.get(status)


class Request:
    """One request as the scheduler sees it.

    Invariant: ``0 <= num_computed_tokens <= num_tokens``; ``all_token_ids`` is prompt then output.
    """

    __slots__ = ("request_id", "prompt_token_ids", "sampling_params", "eos_token_id", "arrival_time",
                 "priority", "cache_salt", "lora_name", "lora_int_id", "status", "output_token_ids", "all_token_ids",
                 "num_computed_tokens", "num_cached_tokens", "num_preemptions", "stop_reason",
                 "stop_token_ids", "max_tokens", "block_hashes", "num_output_placeholders", "needs_last_token",
                 "spec_token_ids")

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_id: int | None, arrival_time: float, priority: int = 0,
                 cache_salt: str | None = None, lora_name: str | None = None, lora_int_id: int | None = None,
                 max_tokens: int = 16):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        self.lora_name = lora_name  # the adapter's name (stats); None: the base model
        self.lora_int_id = lora_int_id  # the adapter's id, unique per registration (see lora_key)
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prompt tokens hit in the prefix cache at first scheduling; -1 = not yet
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        self.stop_token_ids = sampling_params.all_stop_token_ids(eos_token_id)
        self.max_tokens = max_tokens  # already capped by max_model_len - prompt length
        self.block_hashes: list[bytes | int] = []  # hashes of full blocks, filled by the KV cache manager
        # Tokens sampled by a step still in flight (overlapped scheduling): counted, values not yet known.
        self.num_output_placeholders = 0
        # Draft tokens proposed for the next step (speculative decoding); not part of all_token_ids.
        self.spec_token_ids: list[int] = []
        # Whether its next step needs its previous token on the host. Penalties, bad words and min_tokens read
        # the in-flight token on the device (sample.metadata.PendingTokens), prompt logprobs need nothing of it;
        # a grammar must advance its matcher with that token before the next step's bitmask exists, so such a
        # request sits out the steps planned while its token is in flight (Scheduler._num_new_tokens).
        self.needs_last_token = sampling_params.structured_outputs is not None

    @classmethod
    def from_engine_core_request(cls, req: EngineCoreRequest, max_model_len: int) -> Request:
        """Build the engine's record; max_tokens defaults to what fits in max_model_len."""
        room = max_model_len - len(req.prompt_token_ids)
        wanted = req.sampling_params.max_tokens
        max_tokens = room if wanted is None else min(wanted, room)
        return cls(req.request_id, req.prompt_token_ids, req.sampling_params, req.eos_token_id,
                   req.arrival_time, req.priority, req.cache_salt, req.lora_name, req.lora_int_id,
                   max_tokens=max_tokens)

    @property
    def lora_key(self) -> tuple[str, int | None] | None:
        """Which adapter the request runs on, ``(lora_name, lora_int_id)``, or None for the base model. Two
        requests share an adapter (a slot, prefix-cache blocks) exactly when their keys are equal: an adapter
        unloaded and loaded again under the same name has a new id, so it is another adapter."""
        return None if self.lora_name is None else (self.lora_name, self.lora_int_id)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        return len(self.all_token_ids) + self.num_output_placeholders

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finish_reason(self) -> FinishReason | None:
        return RequestStatus.finish_reason(self.status)

    def __lt__(self, other: Request) -> bool:
        # Priority queue order: lower priority value first, then earlier arrival.
        return (self.priority, self.arrival_time, self.request_id) < \
            (other.priority, other.arrival_time, other.request_id)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")
