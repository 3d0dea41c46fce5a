"""The model runner's per-request state and the flat inputs it builds for one step (vLLM v1's
flattened batch).

Requests are laid out back to back in the token dimension, decodes (one new token) first, so the
attention metadata can split decode and prefill work by a single count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Protocol

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
    block_ids: tuple[list[int], ...]  # its block table per KV cache group
    num_computed_tokens: int  # tokens whose KV is in the cache before this step
    sampling: SamplingRequestState
    num_pending: int = 0  # sampled by a step in flight: on the device, not yet in token_ids
    lora_int_id: int | None = None  # the LoRA adapter it runs with (its lora_int_id); None: the base model
    # A pipeline stage before the last: the drafts its last step computed, not verified here (the last stage
    # verifies); the next schedule's computed count says how many were accepted (``RequestStates.update``).
    unverified_drafts: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + self.num_pending


@dataclass(slots=True)
class StepInputs:
    """Everything one forward pass reads, already on the device."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    metadata: AttentionMetadata
    # [num_logits] int64: the last token row of each request that samples, and with draft tokens the rows of
    # its last sampled token and drafts too (1 + k rows, in order).
    logits_indices: torch.Tensor
    req_ids: list[str]  # batch order
    sampling_req_ids: list[str]  # requests that finish their prompt (or decode) this step, batch order
    # Input rows whose token is the previous step's sample, still on the device (overlapped scheduling).
    pending_rows: list[int]
    pending_req_ids: list[str]
    # Several KV cache groups: each layer's metadata (its group's block table and slot mapping); None: one group.
    layer_metadata: list[AttentionMetadata] | None = None


def group_key(name: str, group: int) -> str:
    """The ``Transfer`` array name of KV cache group ``group``'s ``block_table`` or ``slot_mapping`` (group 0's
    keep the plain names)."""
    return name if group == 0 else f"{name}.{group}"


def layer_metadata(base: AttentionMetadata, tensors: dict[str, torch.Tensor], layer_groups: list[int]
                   ) -> list[AttentionMetadata]:
    """Each layer's metadata for a model with several KV cache groups: ``base`` (group 0's) with the block table
    and slot mapping of the layer's group (``tensors`` by ``group_key`` name); every other field is shared.

    Args:
        layer_groups: per layer index, its KV cache group (0 for a layer without KV cache).
    """
    per_group = [base] + [dataclasses.replace(base, block_table=tensors[group_key("block_table", g)],
                                              slot_mapping=tensors[group_key("slot_mapping", g)])
                          for g in range(1, 1 + max(layer_groups))]
    return [per_group[g] for g in layer_groups]


class Transfer(Protocol):
    """Moves a step's named host arrays to the device: ``input_ids``, ``positions``, ``slot_mapping``,
    ``logits_indices`` (int64) and ``query_start_loc``, ``seq_lens``, ``block_table`` (int32), and with several
    KV cache groups each further group's ``slot_mapping.g`` and ``block_table.g`` (``group_key``). Returns
    device tensors of the same shapes and values by name (``HostToDevice``; the decode graphs' own buffers,
    ``DecodeGraphs.transfer``)."""

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]: ...


def build_step_inputs(states: list[CachedRequestState], num_scheduled: list[int], *, block_size: int,
                      device: torch.device, transfer: Transfer | None = None,
                      spec_token_ids: list[list[int]] | None = None,
                      uniform_query_len: int | None = None, layer_groups: list[int] | None = None) -> StepInputs:
    """Flatten the scheduled requests into one batch.

    Args:
        states: the scheduled requests, decodes first (num_scheduled == 1).
        num_scheduled: new tokens of each request this step (same order).
        block_size: tokens per KV block.
        transfer: the host-to-device mover (a throwaway ``HostToDevice`` when None).
        spec_token_ids: per request (same order), draft tokens d1..dk (speculative decoding), or None for
            none. A request with k drafts is scheduled for 1 + k tokens: its last sampled token then the
            drafts, at positions num_tokens - 1 .. num_tokens - 1 + k; its attention is that of a prefill chunk
            with cached context, and it gets 1 + k logits rows.
        uniform_query_len: pad every request to this many query tokens (a speculative step replayed as a
            CUDA graph of a uniform shape, ``DecodeGraphs(query_len=...)``): padding tokens come after a
            request's real ones, write no KV (slot -1) and get no logits row, and ``seq_lens`` counts them, so
            the real tokens' context and causal masks are unchanged. Every request's real query must fit.
        layer_groups: per layer index, its KV cache group, when the model has several (``layer_metadata``);
            None: one group, every layer reads ``StepInputs.metadata``.
    Returns:
        StepInputs with slot_mapping[t] = block_ids[g][pos // block_size] * block_size + pos % block_size for
        each group ``g``.
    Raises:
        ValueError: a request has more query tokens than ``uniform_query_len``.
    """
    step = _HostStep.lay_out(states, num_scheduled, block_size)
    step.fill_input_ids(states, spec_token_ids)
    sampling = step.fill_logits_indices(states, spec_token_ids)
    if uniform_query_len is not None:
        step.pad_to_uniform(uniform_query_len, block_size)
    is_prefill = step.query_lens != 1
    num_decodes = int(np.argmax(is_prefill)) if is_prefill.any() else len(states)
    dev = (transfer or HostToDevice(device))(step.arrays())
    metadata = AttentionMetadata(
        num_reqs=len(states), num_actual_tokens=step.num_tokens, max_query_len=int(step.query_lens.max()),
        max_seq_len=int(step.seq_lens.max()), num_decodes=num_decodes,
        query_start_loc=dev["query_start_loc"], seq_lens=dev["seq_lens"], block_table=dev["block_table"],
        slot_mapping=dev["slot_mapping"], query_start_loc_cpu=torch.from_numpy(step.query_start),
        seq_lens_cpu=torch.from_numpy(step.seq_lens))
    return StepInputs(input_ids=dev["input_ids"], positions=dev["positions"], metadata=metadata,
                      logits_indices=dev["logits_indices"], req_ids=[s.req_id for s in states],
                      sampling_req_ids=[states[r].req_id for r in sampling],
                      pending_rows=step.pending_rows, pending_req_ids=step.pending_req_ids,
                      layer_metadata=layer_metadata(metadata, dev, layer_groups) if layer_groups else None)


@dataclass
class _HostStep:
    """A step's host arrays while ``build_step_inputs`` lays them out (numpy, token rows request after
    request)."""

    query_lens: np.ndarray  # [num_reqs] int32
    computed: np.ndarray  # [num_reqs] int32, tokens already in the KV cache
    seq_lens: np.ndarray  # [num_reqs] int32, computed + query
    query_start: np.ndarray  # [num_reqs + 1] int32
    positions: np.ndarray  # [num_tokens] int64
    block_table: np.ndarray  # [num_reqs, max_blocks] int32, KV cache group 0's
    slot_mapping: np.ndarray  # [num_tokens] int64, group 0's
    # The other KV cache groups' (block_table, slot_mapping), groups 1.. in order; empty with one group.
    group_tables: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    input_ids: np.ndarray | None = None  # [num_tokens] int64
    logits_indices: np.ndarray | None = None  # [num_logits] int64
    pending_rows: list[int] = field(default_factory=list)
    pending_req_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.positions)

    @classmethod
    def lay_out(cls, states: list[CachedRequestState], num_scheduled: list[int], block_size: int) -> _HostStep:
        """Positions (request r: computed[r] .. seq_lens[r] - 1, concatenated), block tables and slots."""
        num_reqs = len(states)
        query_lens = np.asarray(num_scheduled, dtype=np.int32)
        computed = np.fromiter((s.num_computed_tokens for s in states), dtype=np.int32, count=num_reqs)
        query_start = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(query_lens, out=query_start[1:])
        num_tokens = int(query_start[-1])
        req_of_token = np.repeat(np.arange(num_reqs), query_lens)
        positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(query_start[:-1], query_lens) \
            + np.repeat(computed, query_lens)
        tables = [_table_and_slots(states, g, req_of_token, positions, block_size)
                  for g in range(len(states[0].block_ids))]
        return cls(query_lens=query_lens, computed=computed, seq_lens=computed + query_lens, query_start=query_start,
                   positions=positions, block_table=tables[0][0], slot_mapping=tables[0][1], group_tables=tables[1:])

    def fill_input_ids(self, states: list[CachedRequestState], spec_token_ids: list[list[int]] | None) -> None:
        """Each request's known tokens then its drafts; a last input that is the sample of the step in flight
        stays 0 and is named in ``pending_rows``."""
        self.input_ids = np.zeros(self.num_tokens, dtype=np.int64)
        for r, s in enumerate(states):
            start = int(self.query_start[r])
            drafts = spec_token_ids[r] if spec_token_ids is not None else ()
            known = s.token_ids[int(self.computed[r]):int(self.seq_lens[r]) - len(drafts)]
            self.input_ids[start:start + len(known)] = known
            if drafts:
                self.input_ids[start + len(known):start + len(known) + len(drafts)] = drafts
            if len(known) + len(drafts) < int(self.query_lens[r]):
                self.pending_rows.append(start + len(known))
                self.pending_req_ids.append(s.req_id)

    def fill_logits_indices(self, states: list[CachedRequestState],
                            spec_token_ids: list[list[int]] | None) -> list[int]:
        """The last row of each request that reaches its end (and with drafts, its 1 + k last rows); returns
        those requests' indices."""
        sampling = [r for r, s in enumerate(states) if int(self.seq_lens[r]) >= s.num_tokens]
        logits_indices = self.query_start[1:][sampling] - 1
        if spec_token_ids is not None and any(spec_token_ids[r] for r in sampling):
            logits_indices = np.concatenate([np.arange(end - len(spec_token_ids[r]), end + 1)
                                             for r, end in zip(sampling, logits_indices.tolist())])
        self.logits_indices = logits_indices.astype(np.int64)
        return sampling

    def pad_to_uniform(self, q: int, block_size: int) -> None:
        """Pad every request to ``q`` query tokens (``build_step_inputs(uniform_query_len=)``)."""
        num_reqs = len(self.query_lens)
        if int(self.query_lens.max()) > q:
            raise ValueError(f"a request has {int(self.query_lens.max())} query tokens, more than the uniform {q}")
        # Row t of request r moves from query_start[r] + j to r * q + j.
        new_row = np.repeat(np.arange(num_reqs) * q - self.query_start[:-1], self.query_lens) \
            + np.arange(self.num_tokens)
        padded_ids, padded_slots = np.zeros(num_reqs * q, dtype=np.int64), np.full(num_reqs * q, -1, dtype=np.int64)
        padded_ids[new_row], padded_slots[new_row] = self.input_ids, self.slot_mapping
        self.input_ids, self.slot_mapping = padded_ids, padded_slots
        for g, (table, slots) in enumerate(self.group_tables):
            padded = np.full(num_reqs * q, -1, dtype=np.int64)
            padded[new_row] = slots
            self.group_tables[g] = (table, padded)
        self.positions = (np.repeat(self.computed, q) + np.tile(np.arange(q), num_reqs)).astype(np.int64)
        self.logits_indices = new_row[self.logits_indices]
        self.pending_rows = [int(new_row[row]) for row in self.pending_rows]
        self.query_lens = np.full(num_reqs, q, dtype=np.int32)
        self.query_start = np.arange(num_reqs + 1, dtype=np.int32) * q
        self.seq_lens = self.computed + self.query_lens
        width = -(-int(self.seq_lens.max()) // block_size)  # padding positions may reach past the allocated blocks
        if width > self.block_table.shape[1]:
            self.block_table = np.pad(self.block_table, ((0, 0), (0, width - self.block_table.shape[1])))
        for g, (table, slots) in enumerate(self.group_tables):
            if width > table.shape[1]:
                self.group_tables[g] = (np.pad(table, ((0, 0), (0, width - table.shape[1]))), slots)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a ``Transfer`` moves, by name."""
        arrays = {"input_ids": self.input_ids, "positions": self.positions, "slot_mapping": self.slot_mapping,
                  "logits_indices": self.logits_indices.astype(np.int64), "query_start_loc": self.query_start,
                  "seq_lens": self.seq_lens, "block_table": self.block_table}
        for g, (table, slots) in enumerate(self.group_tables, start=1):
            arrays[group_key("slot_mapping", g)], arrays[group_key("block_table", g)] = slots, table
        return arrays


def _table_and_slots(states: list[CachedRequestState], group: int, req_of_token: np.ndarray, positions: np.ndarray,
                     block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """KV cache group ``group``'s block table [num_reqs, max_blocks] int32 and slot mapping [num_tokens] int64."""
    block_table = np.zeros((len(states), max(len(s.block_ids[group]) for s in states)), dtype=np.int32)
    for r, s in enumerate(states):
        ids = s.block_ids[group]
        block_table[r, :len(ids)] = ids
    slot_mapping = block_table[req_of_token, positions // block_size].astype(np.int64) * block_size \
        + positions % block_size
    return block_table, slot_mapping


class HostToDevice:
    """Moves a step's integer arrays to the device in one copy per dtype, through reused pinned buffers.

    Small separate copies (and pinning fresh memory each step) cost more host time than the decode step
    itself on a fast GPU, so the arrays are packed into one pinned int64 and one pinned int32 buffer. An
    event guards reuse: a buffer is rewritten only after the previous step's copy out of it has run.

    Each array starts at a multiple of ``ALIGN_BYTES`` in its buffer. Triton specializes a kernel on
    whether each pointer is 16-byte aligned, so offsets that followed the step's token and request counts
    compiled new kernel variants in the middle of serving (an inter-token stall of about a second for every
    running request, seen in the H200 serve benchmark).
    """

    ALIGN_BYTES = 64

    def __init__(self, device: torch.device):
        self.device = device
        self._host: dict[torch.dtype, torch.Tensor] = {}
        self._event = torch.cuda.Event() if device.type == "cuda" else None

    def _buffer(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        buf = self._host.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 2 * (buf.numel() if buf is not None else 4096)), dtype=dtype,
                              pin_memory=True)
            self._host[dtype] = buf
        return buf

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Return device tensors with the arrays' shapes, by name (int64 and int32 arrays only)."""
        other = sorted((n, str(a.dtype)) for n, a in arrays.items() if a.dtype not in (np.int64, np.int32))
        if other:
            raise TypeError(f"HostToDevice moves int64 and int32 arrays only, got {other}")
        if self.device.type == "cpu":
            return {name: torch.from_numpy(a) for name, a in arrays.items()}
        if self._event is not None:
            self._event.synchronize()
        out = {}
        for dtype, np_dtype in ((torch.int64, np.int64), (torch.int32, np.int32)):
            group = {name: a for name, a in arrays.items() if a.dtype == np_dtype}
            offsets, total = packed_offsets([a.size for a in group.values()],
                                            self.ALIGN_BYTES // np.dtype(np_dtype).itemsize)
            host = self._buffer(dtype, total)
            host_np = host.numpy()
            for offset, a in zip(offsets, group.values()):
                host_np[offset:offset + a.size] = a.ravel()
            dev = host[:total].to(self.device, non_blocking=True)
            for offset, (name, a) in zip(offsets, group.items()):
                out[name] = dev[offset:offset + a.size].view(a.shape)
        self._event.record()
        return out


def align_up(count: int, align: int) -> int:
    """The smallest multiple of ``align`` not below ``count``."""
    return -(-count // align) * align


def packed_offsets(sizes: list[int], align: int) -> tuple[list[int], int]:
    """Where arrays of ``sizes`` elements start when packed one after another, each at a multiple of
    ``align`` elements, and the total length (elements) that holds them all."""
    offsets, end = [], 0
    for size in sizes:
        start = align_up(end, align)
        offsets.append(start)
        end = start + size
    return offsets, end
