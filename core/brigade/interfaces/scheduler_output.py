"""SchedulerOutput: what the scheduler tells the model runner to compute in one step.

As in vLLM v1, it sends diffs: full data for requests the runner has not seen (new or resumed after
preemption), and only new block ids for requests it already holds. The runner appends sampled tokens to its
own copy of each request, so output tokens never travel back down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from brigade.interfaces.kv_connector import KVConnectorMetadata
from brigade.sampling_params import SamplingParams

if TYPE_CHECKING:
    import numpy as np


@dataclass(slots=True)
class NewRequestData:
    """A request the runner must (re)build: all its tokens so far and its whole block table."""

    req_id: str
    token_ids: list[int]  # prompt + output so far (outputs exist when resumed after preemption)
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_id: int | None
    block_ids: tuple[list[int], ...]  # its block table per KV cache group (KVCacheConfig.groups' order)
    num_computed_tokens: int  # tokens already in the KV cache (prefix-cache hits)
    lora_int_id: int | None = None  # the request's LoRA adapter (its lora_int_id); None: the base model


@dataclass(slots=True)
class CachedRequestData:
    """Requests the runner already holds: per request, blocks added this step and computed tokens."""

    req_ids: list[str] = field(default_factory=list)
    # Per request, the blocks appended to its table this step, one list per KV cache group.
    new_block_ids: list[tuple[list[int], ...]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    # Under pipeline parallelism only (empty otherwise): per request, its output tokens not computed yet (the
    # token sampled last). The stages before the last never sample, so this is how they learn them.
    new_token_ids: list[list[int]] = field(default_factory=list)

    @classmethod
    def make_empty(cls) -> CachedRequestData:
        return cls()


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan. ``num_scheduled_tokens`` maps each scheduled request to its new tokens."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]  # finished or aborted since the last step: the runner drops them
    preempted_req_ids: set[str]  # preempted this step: the runner drops them until they come back new
    # Structured output: row i of grammar_bitmask ([len(ids), ceil(vocab / 32)] int32, bit set = allowed)
    # constrains the token sampled this step for request structured_output_req_ids[i].
    structured_output_req_ids: list[str] = field(default_factory=list)
    grammar_bitmask: np.ndarray | None = None
    # Speculative decoding: draft tokens d1..dk of each decoding request that has some. Such a request is
    # scheduled for 1 + k tokens ([last sampled token, d1..dk]); the runner verifies the drafts and returns
    # the accepted ones plus one token.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # KV connector (--kv-transfer-config): what the worker-role connector loads before this step's
    # forward pass and saves after it (the connector's own KVConnectorMetadata subclass); None without one.
    kv_connector_metadata: KVConnectorMetadata | None = None

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls([], CachedRequestData.make_empty(), {}, 0, set(), set())
