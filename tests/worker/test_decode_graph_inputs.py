"""The decode graphs' input staging: ``DecodeGraphs.transfer`` puts a step's arrays straight into the
graphs' persistent buffers (padded to the graph size) and ``build_step_inputs`` through it gives the same
values as through ``HostToDevice``. Built on the CPU (no graph is captured); the replay itself is covered
by tests/cuda/test_engine_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from brigade.sample.metadata import SamplingRequestState
from brigade.sampling_params import SamplingParams
from brigade.worker.cuda_graph import DecodeGraphs
from brigade.worker.input_batch import CachedRequestState, HostToDevice, build_step_inputs


def _graphs(**kw) -> DecodeGraphs:
    return DecodeGraphs(None, [], [1, 2, 4, 8], max_blocks_per_req=6, max_model_len=96, device=torch.device("cpu"),
                        **kw)


def _state(i: int, context: int, blocks: list[int]) -> CachedRequestState:
    tokens = list(range(100 * i, 100 * i + context + 1))
    sampling = SamplingRequestState(params=SamplingParams(), prompt_token_ids=tokens, output_token_ids=[],
                                    generator=None, eos_token_id=None)
    return CachedRequestState(req_id=f"r{i}", token_ids=tokens, num_prompt_tokens=len(tokens), block_ids=(blocks,),
                              num_computed_tokens=context, sampling=sampling)


def test_transfer_writes_the_graph_buffers_padded_to_the_graph_size():
    graphs = _graphs()
    graphs.slot_mapping.fill_(7)  # stale values from an earlier, larger step
    graphs.seq_lens.fill_(9)
    states = [_state(0, 20, [5, 3]), _state(1, 33, [1, 2, 4]), _state(2, 0, [0])]
    via_graph = build_step_inputs(states, [1, 1, 1], block_size=16, device=torch.device("cpu"),
                                  transfer=graphs.transfer)
    plain = build_step_inputs(states, [1, 1, 1], block_size=16, device=torch.device("cpu"),
                              transfer=HostToDevice(torch.device("cpu")))
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(via_graph, name), getattr(plain, name)), name
    for name in ("slot_mapping", "seq_lens", "block_table", "query_start_loc"):
        assert torch.equal(getattr(via_graph.metadata, name), getattr(plain.metadata, name)), name
    # The step's tensors are the graph buffers themselves, so run() has nothing to copy.
    assert via_graph.input_ids.data_ptr() == graphs.input_ids.data_ptr()
    assert via_graph.metadata.block_table.data_ptr() == graphs.block_table.data_ptr()
    # Three requests replay the 4-graph: its padding row has slot -1 and seq_len 0.
    assert graphs.slot_mapping[3] == -1 and graphs.seq_lens[3] == 0
    assert graphs.slot_mapping[:3].tolist() == [3 * 16 + 4, 4 * 16 + 1, 0]
    assert graphs.seq_lens[:3].tolist() == [21, 34, 1]
    assert graphs.block_table[1, :3].tolist() == [1, 2, 4]


@pytest.mark.parametrize("sizes", [[1], [1, 2, 3], [1, 2, 4, 8]])
def test_graph_buffers_start_at_aligned_offsets(sizes):
    """Each input array of the graphs starts 64 bytes into the shared buffer or a multiple of it (Triton
    specializes kernels on 16-byte pointer alignment), whatever the largest size and block-table width."""
    graphs = DecodeGraphs(None, [], sizes, max_blocks_per_req=5, max_model_len=80, device=torch.device("cpu"))
    base = graphs.buffers._dev.data_ptr()
    for name in ("input_ids", "positions", "slot_mapping", "logits_indices", "seq_lens", "query_start_loc",
                 "block_table"):
        assert (getattr(graphs, name).data_ptr() - base) % 64 == 0, name
    assert graphs.block_table.shape == (sizes[-1], 5) and graphs.query_start_loc.tolist() == list(
        range(sizes[-1] + 1))


def test_run_refuses_a_step_not_staged_in_the_graph_buffers():
    states = [_state(0, 20, [5, 3])]
    plain = build_step_inputs(states, [1], block_size=16, device=torch.device("cpu"),
                              transfer=HostToDevice(torch.device("cpu")))
    with pytest.raises(ValueError, match="DecodeGraphs.transfer"):
        _graphs().run(plain)


def test_transfer_refuses_a_step_the_graphs_cannot_hold():
    graphs = _graphs()
    arrays = {"input_ids": np.zeros(9, np.int64), "positions": np.zeros(9, np.int64),
              "slot_mapping": np.zeros(9, np.int64), "logits_indices": np.zeros(9, np.int64),
              "query_start_loc": np.arange(10, dtype=np.int32), "seq_lens": np.ones(9, np.int32),
              "block_table": np.zeros((9, 1), np.int32)}
    with pytest.raises(ValueError, match="9 requests"):
        graphs.transfer(arrays)


def test_context_buckets_per_batch_size():
    graphs = _graphs(seq_len_buckets=lambda size, max_len: (32, max_len) if size <= 2 else (max_len,))
    assert graphs.buckets == {1: [32, 96], 2: [32, 96], 4: [96], 8: [96]}
    assert _graphs().buckets == {1: [96], 2: [96], 4: [96], 8: [96]}


def test_uniform_query_len_pads_each_request_after_its_real_tokens():
    """Speculative verification steps padded to 1 + k tokens a request (``uniform_query_len``): each request's
    real tokens (last sample, then its drafts) keep their positions and slots at rows r*q.., its padding rows
    write nothing (slot -1) and get no logits row, seq_lens count the padding (so the real tokens' context is
    unchanged), and the verification graphs' transfer gives the same values as a plain one."""
    states = [_state(0, 20, [5, 3]), _state(1, 33, [1, 2, 4]), _state(2, 40, [6, 7, 8])]
    drafts = [[7, 8], [], [9, 10, 11]]
    scheduled = [1 + len(d) for d in drafts]
    q = 4
    plain = build_step_inputs(states, scheduled, block_size=16, device=torch.device("cpu"), spec_token_ids=drafts)
    padded = build_step_inputs(states, scheduled, block_size=16, device=torch.device("cpu"), spec_token_ids=drafts,
                               uniform_query_len=q)
    md = padded.metadata
    assert md.num_actual_tokens == 12 and md.max_query_len == q and md.num_decodes == 0
    assert md.query_start_loc.tolist() == [0, 4, 8, 12]
    assert md.seq_lens.tolist() == [24, 37, 44]
    rows = [0, 1, 2, 4, 8, 9, 10, 11]  # where the plain step's 8 token rows went
    assert padded.input_ids[rows].tolist() == plain.input_ids.tolist()
    assert padded.positions[rows].tolist() == plain.positions.tolist()
    assert md.slot_mapping[rows].tolist() == plain.metadata.slot_mapping.tolist()
    assert md.slot_mapping[[3, 5, 6, 7]].tolist() == [-1] * 4
    assert padded.positions.tolist()[4:8] == [33, 34, 35, 36]  # padding keeps counting positions
    assert padded.logits_indices.tolist() == [rows[i] for i in plain.logits_indices.tolist()]
    assert md.block_table.shape[1] >= 3  # request 1's padding reaches its third block's positions
    graphs = DecodeGraphs(None, [], [1, 2, 4], max_blocks_per_req=6, max_model_len=96,
                          device=torch.device("cpu"), query_len=q)
    via_graph = build_step_inputs(states, scheduled, block_size=16, device=torch.device("cpu"),
                                  spec_token_ids=drafts, uniform_query_len=q, transfer=graphs.transfer)
    assert torch.equal(via_graph.input_ids, padded.input_ids)
    assert torch.equal(via_graph.logits_indices, padded.logits_indices)
    for name in ("slot_mapping", "seq_lens", "query_start_loc", "positions"):
        a = getattr(via_graph.metadata, name, None)
        if a is None:
            a, b = via_graph.positions, padded.positions
        else:
            b = getattr(md, name)
        assert torch.equal(a, b), name
    # Three requests replay the 4-request graph: the padding request's tokens write nothing.
    assert graphs.slot_mapping[12:16].tolist() == [-1] * 4 and graphs.seq_lens[3] == q
    with pytest.raises(ValueError, match="more than the uniform"):
        build_step_inputs(states, [1, 1, 6], block_size=16, device=torch.device("cpu"),
                          spec_token_ids=[[], [], [1, 2, 3, 4, 5]], uniform_query_len=q)
