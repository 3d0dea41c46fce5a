"""Gemma 2, Gemma 3 (text), Phi-3 and Mistral end to end against transformers' own classes (fp32, CPU) on tiny
random-weight checkpoints with windows of 16 to 32 tokens: prompts several windows long go in together, under
chunked prefill (a 32-token budget), a KV pool too small for all of them (preemption) and prefix caching (two prompts
share a 64-token prefix); Brigade's 64 greedy tokens equal transformers' and every KV block comes back. Then the
per-layer attention each family builds (windows, soft-caps, scales, ropes), Phi-3's LongRoPE within its original
length, and the start-up refusals of what Brigade cannot run, one line each."""

from __future__ import annotations

import pytest
import torch
from family_checkpoints import family_config, greedy_reference, save_family_checkpoint

from brigade import LLM, SamplingParams
from brigade.config import BrigadeConfig, ConfigError, ModelConfig
from brigade.model_executor.layers.attention import Attention
from brigade.model_executor.loader import check_model_config

MAX_NEW_TOKENS = 64
# 16-token blocks: one request of max_model_len fits, the three together do not. Layers with equal specs share a block
# table (KV cache groups) and a sliding-window group holds only its window and one chunk a request, so each family
# gets the pool that still forces preemption: gemma2 (full + sliding group, 2 layers each) and gemma3 (one full and
# three sliding groups of 1 layer) hold up to 16 and 27 blocks a request; phi3 and mistral (every layer windowed: one
# sliding group) 5, 3 while decoding.
ENGINE = {"max_model_len": 192, "block_size": 16, "max_num_batched_tokens": 32, "max_num_seqs": 3,
          "enable_prefix_caching": True}
NUM_BLOCKS = {"gemma2": 28, "gemma3": 40, "phi3": 6, "mistral": 6}


def _prompts(seed: int = 7) -> list[list[int]]:
    """Three prompts past Phi-3's original length (64): the second repeats the first's 64-token prefix."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.randint(0, 256, (96,), generator=gen).tolist()
    shared = first[:64] + torch.randint(0, 256, (16,), generator=gen).tolist()
    return [first, shared, torch.randint(0, 256, (70,), generator=gen).tolist()]


def _generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "phi3", "mistral"])
def test_greedy_tokens_equal_transformers_past_the_window(family, tmp_path):
    path = tmp_path / family
    hf_model = save_family_checkpoint(family_config(family), path)
    prompts = _prompts()
    expected = greedy_reference(hf_model, prompts, MAX_NEW_TOKENS)
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, num_gpu_blocks_override=NUM_BLOCKS[family],
              **ENGINE)
    assert _generate(llm, prompts, MAX_NEW_TOKENS) == expected
    scheduler = llm.engine.core.scheduler
    assert scheduler.num_preemptions_total > 0, "the small KV pool should have forced preemption"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


def test_phi3_within_its_original_length_uses_the_short_factors(tmp_path):
    """max_model_len 64 (Phi-3's original length): every sequence stays within it, transformers rotates with the
    short factors, and so does Brigade."""
    path = tmp_path / "phi3"
    hf_model = save_family_checkpoint(family_config("phi3"), path)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (40, 33)]
    expected = greedy_reference(hf_model, prompts, 24)
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, max_model_len=64, block_size=16)
    assert _generate(llm, prompts, 24) == expected


def _attention_layers(tmp_path, family: str) -> list[Attention]:
    path = tmp_path / family
    save_family_checkpoint(family_config(family), path)
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, max_model_len=128, block_size=16)
    model = llm.engine.core.executor.worker.model_runner.model
    return sorted((m for m in model.modules() if isinstance(m, Attention)), key=lambda m: m.layer_idx)


@pytest.mark.parametrize("family,windows,cap,scale", [
    ("gemma2", [16, None, 16, None], 5.0, 24 ** -0.5),  # even layers slide
    ("gemma3", [24, 24, None, 24], None, 16 ** -0.5),  # every third layer is global (sliding_window_pattern 3)
    ("phi3", [32, 32, 32], None, 16 ** -0.5),
])
def test_each_layer_gets_its_window_cap_and_scale(family, windows, cap, scale, tmp_path):
    layers = _attention_layers(tmp_path, family)
    assert [m.sliding_window for m in layers] == windows
    assert {m.logits_soft_cap for m in layers} == {cap}
    assert [m.scale for m in layers] == pytest.approx([scale] * len(layers))


@pytest.mark.parametrize("family,overrides,needle", [
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "Gemma3ForCausalLM: rope type 'dynamic' is not supported; Brigade implements default, linear, llama3, yarn, "
     "longrope"),
    ("gemma2", {"hidden_activation": "gelu"}, "Gemma2ForCausalLM: activation 'gelu' is not supported"),
    ("gemma3", {"use_bidirectional_attention": True}, "Gemma3ForCausalLM: bidirectional attention"),
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     "Phi3ForCausalLM: longrope rope scaling needs a 'short_factor' list in rope_parameters"),
    ("mistral", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "LlamaForCausalLM: rope type 'dynamic' is not supported"),
])
def test_a_config_brigade_cannot_serve_is_one_line(family, overrides, needle):
    hf_config = family_config(family)
    for key, value in overrides.items():
        setattr(hf_config, key, value)
    with pytest.raises(ConfigError) as info:
        check_model_config(hf_config, BrigadeConfig(ModelConfig(model="m")))
    message = str(info.value)
    assert "\n" not in message and message.startswith(needle), message
