"""The model runner's per-request state and the flat inputs it builds for one step (book ch. 5).

Requests are laid out back to back in the token dimension, decodes (one new token) first, so the
attention metadata can split decode and prefill work by a single count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from brigade.attention.backend import AttentionMetadata
from brigade.sample.metadata import SamplingRequestState


@dataclass(slots=True)
class CachedRequestState:
    """The runner's copy of one request. ``token_ids`` grows as the runner samples."""

    req_id: str
    token_ids: list[int]  # prompt + output; the runner appends each sampled token
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int  # tokens whose KV is in the cache before this step
    sampling: SamplingRequestState

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(slots=True)
class StepInputs:
    """Everything one forward pass reads, already on the device."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64: last token row of each request that samples
    req_ids: list[str]  # batch order
    sampling_req_ids: list[str]  # requests that finish their prompt (or decode) this step, batch order


def build_step_inputs(states: list[CachedRequestState], num_scheduled: list[int], *, block_size: int,
                      device: torch.device, pin_memory: bool = False) -> StepInputs:
    """Flatten the scheduled requests into one batch.

    Args:
        states: the scheduled requests, decodes first (num_scheduled == 1).
        num_scheduled: new tokens of each request this step (same order).
        block_size: tokens per KV block.
    Returns:
        StepInputs with slot_mapping[t] = block_ids[pos // block_size] * block_size + pos % block_size.
    """
    num_reqs = len(states)
    query_lens = np.asarray(num_scheduled, dtype=np.int32)
    computed = np.fromiter((s.num_computed_tokens for s in states), dtype=np.int32, count=num_reqs)
    seq_lens = computed + query_lens
    query_start = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=query_start[1:])
    num_tokens = int(query_start[-1])

    # Positions: for request r, computed[r] .. seq_lens[r]-1, concatenated.
    req_of_token = np.repeat(np.arange(num_reqs), query_lens)
    positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(query_start[:-1], query_lens) \
        + np.repeat(computed, query_lens)

    max_blocks = max(len(s.block_ids) for s in states)
    block_table = np.zeros((num_reqs, max_blocks), dtype=np.int32)
    for r, s in enumerate(states):
        block_table[r, :len(s.block_ids)] = s.block_ids
    slot_mapping = block_table[req_of_token, positions // block_size].astype(np.int64) * block_size \
        + positions % block_size

    input_ids = np.empty(num_tokens, dtype=np.int64)
    for r, s in enumerate(states):
        start = int(query_start[r])
        input_ids[start:start + int(query_lens[r])] = s.token_ids[int(computed[r]):int(seq_lens[r])]

    sampling = [r for r, s in enumerate(states) if int(seq_lens[r]) >= s.num_tokens]
    logits_indices = query_start[1:][sampling] - 1
    is_prefill = query_lens != 1
    num_decodes = int(np.argmax(is_prefill)) if is_prefill.any() else num_reqs

    def to_dev(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        if device.type == "cpu":
            return t
        if pin_memory:
            t = t.pin_memory()
        return t.to(device, non_blocking=True)

    qsl_cpu = torch.from_numpy(query_start)
    seq_lens_cpu = torch.from_numpy(seq_lens)
    metadata = AttentionMetadata(
        num_reqs=num_reqs, num_actual_tokens=num_tokens, max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()), num_decodes=num_decodes,
        query_start_loc=to_dev(query_start), seq_lens=to_dev(seq_lens), block_table=to_dev(block_table),
        slot_mapping=to_dev(slot_mapping), query_start_loc_cpu=qsl_cpu, seq_lens_cpu=seq_lens_cpu)
    return StepInputs(input_ids=to_dev(input_ids), positions=to_dev(positions), metadata=metadata,
                      logits_indices=to_dev(logits_indices.astype(np.int64)),
                      req_ids=[s.req_id for s in states],
                      sampling_req_ids=[states[r].req_id for r in sampling])
