"""The mixed-step graphs' input staging (``MixedGraphs``): a step of any mix goes into the persistent buffers
padded to the graph's token and request counts (padding tokens slot -1, padding requests query length 0 and
seq_len 0), with the same values as a plain transfer. Built on the CPU (no graph is captured); the padded
layout end to end is in tests/engine/test_greedy_equality.py (``pad_mixed_steps``), the replay on a GPU in
tests/cuda/test_engine_gpu.py."""

from __future__ import annotations

import pytest
import torch

from brigade.config import CompilationConfig, ConfigError, config_from_kwargs
from brigade.sample.metadata import SamplingRequestState
from brigade.sampling_params import SamplingParams
from brigade.worker.mixed_graph import MixedGraphs, default_mixed_sizes
from brigade.worker.input_batch import CachedRequestState, HostToDevice, build_step_inputs

CPU = torch.device("cpu")


def _graphs(max_reqs: int = 8) -> MixedGraphs:
    return MixedGraphs(None, [], [8, 16, 32], max_reqs=max_reqs, max_blocks_per_req=6, max_model_len=96,
                       device=CPU)


def _state(i: int, length: int, computed: int, blocks: list[int]) -> CachedRequestState:
    tokens = list(range(100 * i, 100 * i + length))
    sampling = SamplingRequestState(params=SamplingParams(), prompt_token_ids=tokens, output_token_ids=[],
                                    generator=None, eos_token_id=None)
    return CachedRequestState(req_id=f"r{i}", token_ids=tokens, num_prompt_tokens=len(tokens), block_ids=(blocks,),
                              num_computed_tokens=computed, sampling=sampling)


def test_transfer_pads_tokens_requests_and_logits_rows():
    graphs = _graphs()
    b = graphs.buffers
    b.slot_mapping.fill_(7)  # stale values from an earlier step
    b.seq_lens.fill_(9)
    b.query_start_loc.fill_(3)
    # Two decodes, a prefill chunk with context (not sampling yet) and a whole prompt: 2 + 6 + 5 = 13 tokens.
    states = [_state(0, 21, 20, [5, 3]), _state(1, 34, 33, [1, 2, 4]), _state(2, 40, 10, [6, 7, 8]),
              _state(3, 5, 0, [9])]
    scheduled = [1, 1, 6, 5]
    via_graph = build_step_inputs(states, scheduled, block_size=16, device=CPU, transfer=graphs.transfer)
    plain = build_step_inputs(states, scheduled, block_size=16, device=CPU, transfer=HostToDevice(CPU))
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(via_graph, name), getattr(plain, name)), name
    for name in ("slot_mapping", "seq_lens", "block_table", "query_start_loc"):
        assert torch.equal(getattr(via_graph.metadata, name), getattr(plain.metadata, name)), name
    assert via_graph.input_ids.data_ptr() == b.input_ids.data_ptr()
    # 13 tokens replay the 16-token graph, which holds min(16, 8) = 8 requests.
    assert b.slot_mapping[13:16].tolist() == [-1] * 3
    assert b.positions[13:16].tolist() == [0] * 3
    assert b.query_start_loc[:9].tolist() == [0, 1, 2, 8, 13, 13, 13, 13, 13]
    assert b.seq_lens[:8].tolist() == [21, 34, 16, 5, 0, 0, 0, 0]
    assert b.logits_indices[:3].tolist() == [0, 1, 12]
    md = graphs._metadata(16)
    assert md.mixed_graph and md.num_reqs == 8 and md.num_actual_tokens == 16 and md.num_decodes == 0
    assert md.query_start_loc_cpu.tolist() == b.query_start_loc[:9].tolist()


def test_can_run_and_refusals():
    graphs = _graphs(max_reqs=4)
    assert graphs.max_reqs == 4 and graphs.reqs(8) == 4 and graphs.size_for(9) == 16 and graphs.size_for(16) == 16
    assert graphs.can_run(32, 4) and graphs.can_run(1, 1)
    assert not graphs.can_run(33, 1)  # more tokens than the largest graph: eager
    assert not graphs.can_run(8, 5)  # more requests than max_reqs
    states = [_state(i, 3, 0, [i]) for i in range(5)]
    with pytest.raises(ValueError, match="does not fit the mixed-step CUDA graphs"):
        build_step_inputs(states, [3] * 5, block_size=16, device=CPU, transfer=graphs.transfer)


def test_run_refuses_a_step_not_staged_in_the_graph_buffers():
    plain = build_step_inputs([_state(0, 5, 0, [1])], [5], block_size=16, device=CPU, transfer=HostToDevice(CPU))
    with pytest.raises(ValueError, match="MixedGraphs.transfer"):
        _graphs().run(plain)


def test_default_sizes_and_modes():
    sizes = default_mixed_sizes(8192, 2)
    assert sizes[:3] == [8, 16, 24] and sizes[31:34] == [256, 272, 288] and sizes[-1] == 512 and len(sizes) == 48
    assert default_mixed_sizes(8192, 3)[-1] == 1024 and default_mixed_sizes(100, 2)[-1] == 96
    assert default_mixed_sizes(4, 2) == [8]
    assert CompilationConfig().resolved_cudagraph_mode(False) == "FULL"
    assert CompilationConfig(level=1).resolved_cudagraph_mode(False) == "NONE"
    assert CompilationConfig(level=1, cudagraph_mode="full").resolved_cudagraph_mode(False) == "FULL"  # flag wins
    assert CompilationConfig(cudagraph_mode="FULL_DECODE_ONLY").resolved_cudagraph_mode(False) == "FULL_DECODE_ONLY"
    assert CompilationConfig(cudagraph_mode="FULL").resolved_cudagraph_mode(True) == "NONE"  # --enforce-eager
    with pytest.raises(ConfigError, match="no piecewise graphs.*use FULL"):
        CompilationConfig(cudagraph_mode="FULL_AND_PIECEWISE")
    with pytest.raises(ConfigError, match="mixed_capture_sizes"):
        CompilationConfig(mixed_capture_sizes=[16, -1])


def test_llm_takes_compilation_config_as_vllm_does():
    """``LLM(model, compilation_config=...)``: a level, a dict or a CompilationConfig, as vLLM's LLM takes it;
    unknown keys and modes are one-line ConfigErrors."""
    def comp(value):
        return config_from_kwargs("m", compilation_config=value).compilation_config

    assert comp({"cudagraph_mode": "full_decode_only"}).cudagraph_mode == "FULL_DECODE_ONLY"
    assert comp(3).level == 3 and comp(CompilationConfig(level=1, mixed_capture_sizes=[8])).mixed_capture_sizes == [8]
    with pytest.raises(ConfigError, match=r"unknown keys \['x'\]; allowed: level"):
        comp({"x": 1})
    with pytest.raises(ConfigError, match="a level .0-3., a dict or a CompilationConfig, got str"):
        comp("O3")
    with pytest.raises(ConfigError, match="optimization level 7 is not a level"):
        comp(7)
