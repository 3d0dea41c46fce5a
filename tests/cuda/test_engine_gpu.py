"""The whole engine on a CUDA GPU (Triton attention, fused ops, decode and mixed-step CUDA graphs) against HF
transformers.

A small random-weight Llama is built here with transformers in fp32; greedy tokens from Brigade's engine
must equal transformers' ``generate`` on the same weights, with and without CUDA graphs, under chunked
prefill and prefix caching. Skips on machines without CUDA (CI has none).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from tiny_llama import tiny_llama_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))
from padded_graphs import pad_steps  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NUM_NEW = 32


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_llama_config()
    model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (3, 17, 40, 64, 100, 129, 7, 250)]
    model = model.to("cuda")
    expected = []
    with torch.inference_mode():
        for p in prompts:
            out = model.generate(torch.tensor([p], device="cuda"), max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW,
                                 do_sample=False, attention_mask=torch.ones(1, len(p), dtype=torch.long,
                                                                             device="cuda"), pad_token_id=0)
            expected.append(out[0, len(p):].tolist())
    del model
    torch.cuda.empty_cache()
    return str(path), prompts, expected


@pytest.mark.parametrize("kwargs", [
    {},  # CUDA graphs for decode, overlapped scheduling, triton backend
    {"enforce_eager": True},
    {"async_scheduling": False},
    {"max_num_batched_tokens": 64, "enable_prefix_caching": True},
    {"num_gpu_blocks_override": 24, "block_size": 16, "max_model_len": 368},  # preemption while steps overlap
    {"cudagraph_mode": "FULL_DECODE_ONLY"},  # mixed steps eager
    {"max_num_batched_tokens": 48, "max_num_seqs": 4},  # every step fits a mixed graph, padded requests
], ids=["cudagraphs", "eager", "sync", "chunked", "preemption", "decode_graphs_only", "all_graphed"])
def test_engine_greedy_equals_transformers_on_gpu(tiny_llama, kwargs):
    from brigade import LLM, SamplingParams

    path, prompts, expected = tiny_llama
    llm = LLM(path, dtype="float32", skip_tokenizer_init=True, gpu_memory_utilization=0.5,
              **{"max_model_len": 512, **kwargs})
    assert llm.engine.core.overlap == kwargs.get("async_scheduling", True)
    runner = llm.engine.core.executor.worker.model_runner
    dispatch = pad_steps(runner)  # counts the steps run in a mixed graph's layout (its switches stay off)
    assert runner.attn_backend.name == "triton"
    assert (runner.graphs.decode is not None) == (not kwargs.get("enforce_eager", False))
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    # A second pass hits the prefix cache and must not change anything.
    again = llm.generate(prompts, params, use_tqdm=False)
    for i, (out, out2, ref) in enumerate(zip(outputs, again, expected)):
        assert out.outputs[0].token_ids == ref, f"prompt {i} differs from transformers"
        assert out2.outputs[0].token_ids == ref, f"prompt {i} differs on the prefix-cached pass"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    # Mixed steps (prefills and chunks with decodes) of up to 512 tokens replay mixed-step graphs (FULL mode):
    # the prefix-cached pass and the chunked configurations have such steps.
    full = not kwargs.get("enforce_eager") and kwargs.get("cudagraph_mode") != "FULL_DECODE_ONLY"
    assert (runner.graphs.mixed is not None) == full
    if full:
        mixed = runner.graphs.mixed
        assert mixed.num_replays > 0 and dispatch.num_padded_mixed_steps == mixed.num_replays
    if "num_gpu_blocks_override" in kwargs:
        assert llm.engine.core.scheduler.num_preemptions_total > 0
    del llm
    torch.cuda.empty_cache()


@pytest.mark.parametrize("env", ["BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN", "BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN"])
def test_short_context_graphs_give_the_same_tokens(tiny_llama, monkeypatch, env):
    """Decode graphs captured per context bucket (up to 64 tokens: single-split decode, or the split count
    chosen for 64 tokens): contexts from 4 to 281 tokens cross the bucket while generating, and the tokens
    still equal transformers'."""
    from brigade import LLM, SamplingParams
    from brigade_cuda.attention.triton_backend import short_graph_lens, single_split_len

    path, prompts, expected = tiny_llama
    monkeypatch.setenv(env, "64")
    single_split_len.cache_clear()
    short_graph_lens.cache_clear()
    try:
        llm = LLM(path, dtype="float32", skip_tokenizer_init=True, kv_cache_memory_gib=2, max_model_len=512)
        graphs = llm.engine.core.executor.worker.model_runner.graphs.decode
        assert (1, 64) in graphs.graphs and (1, 512) in graphs.graphs
        params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
        for p, ref in zip(prompts, expected):  # one at a time: batch-1 graphs, both buckets
            assert llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids == ref
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == expected
        del llm
        torch.cuda.empty_cache()
    finally:
        monkeypatch.delenv(env)
        single_split_len.cache_clear()
        short_graph_lens.cache_clear()
