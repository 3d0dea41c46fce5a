"""The flattened batch of one step (``build_step_inputs``), on the CPU in milliseconds: positions, slot mapping,
attention counts, the rows that get logits, in-flight samples, drafts and uniform padding; and the host-to-device
packing helpers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from brigade.sample.metadata import SamplingRequestState
from brigade.sampling_params import SamplingParams
from brigade.worker.input_batch import (CachedRequestState, HostToDevice, align_up, build_step_inputs,
                                        packed_offsets)

BLOCK = 4
CPU = torch.device("cpu")


def state(req_id: str, token_ids: list[int], block_ids: list[int], num_computed: int, *, num_prompt: int | None = None,
          num_pending: int = 0) -> CachedRequestState:
    num_prompt = len(token_ids) if num_prompt is None else num_prompt
    sampling = SamplingRequestState(params=SamplingParams(temperature=0), prompt_token_ids=token_ids[:num_prompt],
                                    output_token_ids=token_ids[num_prompt:], generator=None, eos_token_id=0)
    return CachedRequestState(req_id=req_id, token_ids=list(token_ids), num_prompt_tokens=num_prompt,
                              block_ids=(list(block_ids),), num_computed_tokens=num_computed, sampling=sampling,
                              num_pending=num_pending)


def test_a_decode_and_a_prefill_chunk_lay_out_back_to_back():
    decode = state("d", [11, 12, 13, 14, 15, 16], [7, 3], num_computed=5, num_prompt=5)  # one new token at 5
    prefill = state("p", list(range(100, 110)), [2, 9, 4], num_computed=0)  # first 6 of 10 prompt tokens
    step = build_step_inputs([decode, prefill], [1, 6], block_size=BLOCK, device=CPU)
    assert step.input_ids.tolist() == [16, 100, 101, 102, 103, 104, 105]
    assert step.positions.tolist() == [5, 0, 1, 2, 3, 4, 5]
    # slot = block_ids[pos // 4] * 4 + pos % 4
    assert step.metadata.slot_mapping.tolist() == [3 * 4 + 1, 8, 9, 10, 11, 36, 37]
    assert step.metadata.query_start_loc.tolist() == [0, 1, 7]
    assert step.metadata.seq_lens.tolist() == [6, 6]
    assert step.metadata.block_table.tolist() == [[7, 3, 0], [2, 9, 4]]
    assert (step.metadata.num_decodes, step.metadata.num_actual_tokens, step.metadata.max_query_len) == (1, 7, 6)
    # only the decode reaches its last token: the chunked prefill gets no logits row
    assert step.logits_indices.tolist() == [0] and step.sampling_req_ids == ["d"] and step.req_ids == ["d", "p"]


def test_a_prefill_that_ends_this_step_samples_from_its_last_row():
    prefill = state("p", [5, 6, 7, 8, 9], [1, 2], num_computed=2)
    step = build_step_inputs([prefill], [3], block_size=BLOCK, device=CPU)
    assert step.input_ids.tolist() == [7, 8, 9] and step.positions.tolist() == [2, 3, 4]
    assert step.logits_indices.tolist() == [2] and step.sampling_req_ids == ["p"]
    assert step.metadata.num_decodes == 0


def test_the_sample_of_the_step_in_flight_is_a_pending_row():
    """Overlapped scheduling: the input of a decode is the token the previous step sampled, still on the device."""
    running = state("r", [1, 2, 3], [5], num_computed=3, num_pending=1)
    step = build_step_inputs([running], [1], block_size=BLOCK, device=CPU)
    assert step.input_ids.tolist() == [0]  # filled on the device
    assert step.pending_rows == [0] and step.pending_req_ids == ["r"] and step.positions.tolist() == [3]


def test_drafts_follow_the_last_token_and_each_gets_a_logits_row():
    request = state("s", [1, 2, 3, 4], [6, 8], num_computed=3)  # last sampled token 4, drafts 21, 22
    step = build_step_inputs([request], [3], block_size=BLOCK, device=CPU, spec_token_ids=[[21, 22]])
    assert step.input_ids.tolist() == [4, 21, 22] and step.positions.tolist() == [3, 4, 5]
    assert step.logits_indices.tolist() == [0, 1, 2]
    assert step.metadata.slot_mapping.tolist() == [6 * 4 + 3, 8 * 4, 8 * 4 + 1]


def test_uniform_padding_writes_no_kv_and_keeps_the_real_rows():
    a = state("a", [1, 2, 3, 4], [6, 8], num_computed=3)
    b = state("b", [5, 6, 7], [9], num_computed=2)
    step = build_step_inputs([a, b], [2, 1], block_size=BLOCK, device=CPU, spec_token_ids=[[30], []],
                             uniform_query_len=2)
    assert step.input_ids.tolist() == [4, 30, 7, 0]
    assert step.metadata.slot_mapping.tolist() == [6 * 4 + 3, 8 * 4, 9 * 4 + 2, -1]
    assert step.metadata.query_start_loc.tolist() == [0, 2, 4] and step.metadata.seq_lens.tolist() == [5, 4]
    assert step.logits_indices.tolist() == [0, 1, 2]  # no row for the padding token
    with pytest.raises(ValueError, match="more than the uniform"):
        build_step_inputs([a], [3], block_size=BLOCK, device=CPU, spec_token_ids=[[30, 31]], uniform_query_len=2)


def test_num_tokens_counts_pending_samples():
    assert state("x", [1, 2, 3], [1], num_computed=3, num_pending=2).num_tokens == 5


def test_packed_offsets_align_every_array():
    assert align_up(0, 8) == 0 and align_up(1, 8) == 8 and align_up(16, 8) == 16
    assert packed_offsets([3, 8, 1], 8) == ([0, 8, 16], 17)
    assert packed_offsets([], 16) == ([], 0)


def test_host_to_device_on_the_cpu_shares_the_arrays_and_refuses_floats():
    move = HostToDevice(CPU)
    arrays = {"input_ids": np.arange(4, dtype=np.int64), "seq_lens": np.array([2, 2], dtype=np.int32)}
    out = move(arrays)
    assert out["input_ids"].tolist() == [0, 1, 2, 3] and out["seq_lens"].dtype == torch.int32
    with pytest.raises(TypeError, match="int64 and int32 arrays only"):
        move({"scale": np.ones(2, dtype=np.float32)})
