"""``-dp 2`` on CUDA: each engine on its own GPU (engine i sees device i through CUDA_VISIBLE_DEVICES), greedy tokens
equal one engine's, and a grid larger than the visible GPUs is one ConfigError line. Skips without CUDA (the
two-engine test below two GPUs)."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import tiny_llama_config

from brigade import LLM, SamplingParams
from brigade.config import ConfigError

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[17, 3, 250, 9, 44], [1, 2, 3, 4, 5, 6, 7, 8], [300, 301, 302], [5, 100, 7, 420, 11, 12, 13]]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A small random-weight Llama checkpoint (no tokenizer: prompts are token ids)."""
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("dp-tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(path)
    return str(path)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_engines_on_two_gpus_give_the_outputs_of_one(tiny_model, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    # One prompt per call: every step is a batch of one on both sides, so the kernels and their numerics match.
    one = LLM(tiny_model, skip_tokenizer_init=True, max_model_len=512, kv_cache_memory_gib=2)
    expected = [one.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
    one.shutdown()
    del one
    torch.cuda.empty_cache()
    free_before = [torch.cuda.mem_get_info(i)[0] for i in range(2)]
    two = LLM(tiny_model, skip_tokenizer_init=True, max_model_len=512, kv_cache_memory_gib=2,
              data_parallel_size=2)
    try:
        # Each engine holds its weights and a KV pool of about 30% on its own GPU.
        used = [before - torch.cuda.mem_get_info(i)[0] for i, before in enumerate(free_before)]
        assert all(u > 0.2 * torch.cuda.mem_get_info(i)[1] for i, u in enumerate(used)), used
        got = [two.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
        assert got == expected
        assert two.engine.core.balancer.num_received == [2, 2]  # idle engines alternate
    finally:
        two.shutdown()


def test_more_engines_than_gpus_is_one_line(tiny_model, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ConfigError) as info:
        LLM(tiny_model, skip_tokenizer_init=True, data_parallel_size=2)
    assert str(info.value) == ("-dp 2 x -tp 1 x -pp 1 needs 2 cuda devices but 1 are visible (CUDA_VISIBLE_DEVICES=0); "
                               "lower the sizes so that their product is at most 1")
