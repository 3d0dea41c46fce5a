"""Engine I/O: the typed messages between the front end (API server or LLM) and the EngineCore process.

They are msgspec structs with ``array_like=True, omit_defaults=True``: they cross a ZMQ socket once
per request and once per step, so they encode as compact arrays without field names or default values.
"""

from __future__ import annotations

import enum

import msgspec

from brigade.interfaces.lora_request import LoRARequest
from brigade.interfaces.stats import SchedulerStats
from brigade.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    """Why a request ended. The int form keeps the per-step message small."""

    STOP = 0  # EOS, a stop token id or a stop string
    LENGTH = 1  # max_tokens or max_model_len
    ABORT = 2  # the client went away, or the front end aborted it
    ERROR = 3  # the engine failed while running it

    def __str__(self) -> str:
        return ("stop", "length", "abort", "error")[self.value]


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A new request for the EngineCore: token ids already made by the front end.

    Attributes:
        request_id: unique in the engine (the front end fans n > 1 out into child ids).
        prompt_token_ids: the prompt, tokenized.
        sampling_params: SamplingParams with n == 1.
        eos_token_id: the tokenizer's EOS id, or None.
        arrival_time: time.time() in seconds when the front end received it.
        priority: lower runs first under the priority policy.
        cache_salt: mixed into the first block's hash, so prefix-cache hits stay inside a tenant.
        lora_name: the LoRA adapter to run with (registered with the engine beforehand), or None.
        lora_int_id: that adapter's id (set with ``lora_name``): the engine core keys on it.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None
    lora_name: str | None = None
    lora_int_id: int | None = None


class LogprobsLists(msgspec.Struct, array_like=True, gc=False):
    """Top logprobs for a run of positions: row i is one position; column 0 is the chosen token.

    token_ids[i][j], logprobs[i][j] (natural log, from the raw logits), ranks[i] is the chosen token's rank
    (1 = most likely).
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What one request produced in one step."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    prompt_logprobs: LogprobsLists | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id that ended it
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Everything the EngineCore reports after one step (or an error / utility answer)."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    # Set when the engine died; every in-flight request must fail with this message.
    engine_error: str | None = None
    # Answer to a utility call (see EngineCoreUtility), keyed by call id.
    utility_call_id: int | None = None
    # msgpack bytes of the answer (msgspec cannot decode ``Raw | None``: the union drops the Raw).
    utility_result: bytes | None = None
    # Set instead of utility_result when the engine refused the call (a LoRAError's one line for ADD_LORA).
    utility_error: str | None = None
    # Which data-parallel engine sent it (0 .. dp - 1; always 0 without data parallelism).
    engine_index: int = 0
    # ADD messages this engine had taken when it sent this (a running count): the front end's load balancer
    # subtracts it from what it sent there, so requests still on the wire count towards the engine's load.
    num_requests_received: int = 0


class EngineCoreRequestType(enum.Enum):
    """The first frame of each message from the front end to the EngineCore."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x02"


class UtilityMethod(enum.IntEnum):
    """The fixed set of control calls the front end may make on the EngineCore."""

    RESET_PREFIX_CACHE = 0  # returns bool: True when every cached block was dropped
    GET_KV_CACHE_STATS = 1  # returns {"num_free_blocks", "num_total_blocks"}
    IS_SLEEPING = 2  # returns bool
    # (lora_request) returns bool: True when registered, False when its id already was; a bad adapter is a
    # utility_error (the LoRAError's line).
    ADD_LORA = 3
    # (lora_request: the adapter's name and id; its path is not read) returns bool: False for an id not
    # registered. Its weights go once no unfinished request runs on it (requests already running finish on it).
    REMOVE_LORA = 4


class EngineCoreUtility(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One control call on the EngineCore; answered by an EngineCoreOutputs with the same call_id.

    Attributes:
        call_id: the caller's id for the answer.
        method: which call.
        lora_request: the adapter of ADD_LORA and REMOVE_LORA; None for the other calls.
    """

    call_id: int
    method: UtilityMethod
    lora_request: LoRARequest | None = None
