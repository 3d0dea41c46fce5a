"""The fp8 KV cache (``--kv-cache-dtype fp8``) through the whole engine on the CPU, in fp32.

SmolLM2's greedy output with the float8 e4m3 cache (no scales in its checkpoint: 1.0) against the same engine's
fp32 cache; and a tiny random Llama whose checkpoint carries per-layer ``k_scale``/``v_scale`` tensors, in the two
names vLLM reads, which must reach the attention layers and be used by the cache's writes and reads.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from brigade import LLM, SamplingParams
from brigade.attention.fp8_kv import quantize_kv
from fp8_kv_reference import transformers_fp8_greedy, with_scales

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,",
           "1, 2, 3, 4,"]
NEW_TOKENS = 24


def _greedy(llm: LLM, prompts, max_tokens: int = NEW_TOKENS) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and their logprobs."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for o in outs]


def _agreement(base, other) -> tuple[list[int], float]:
    """Per prompt, how many leading tokens are equal; and the mean |logprob difference| over those tokens."""
    same, drift = [], []
    for (tok_a, lp_a), (tok_b, lp_b) in zip(base, other):
        n = next((i for i, (a, b) in enumerate(zip(tok_a, tok_b)) if a != b), len(tok_a))
        same.append(n)
        drift += [abs(a - b) for a, b in zip(lp_a[:n], lp_b[:n])]
    return same, sum(drift) / len(drift)


def test_fp8_cache_follows_the_fp32_cache_and_holds_4x_the_blocks(smollm2_path, caplog):
    """SmolLM2-135M-Instruct in fp32, 4 prompts x 24 greedy tokens, chunked prefill (16-token budget, so prompts
    are also read back from the cache): measured, the fp8 cache (scale 1.0) keeps the first 23, 13, 3 and 24
    tokens of the fp32 cache's output (63 of 96), with a mean chosen-token logprob drift of 0.027 over them.
    Asserted: at least the first 3 tokens of every prompt, 48 of 96 in all, a drift under 0.05; the same
    --kv-cache-memory holds 4x the blocks, all back in the pool after the run; one line says the scales are 1.0."""
    kwargs = {"max_model_len": 256, "kv_cache_memory_gib": 0.02, "max_num_batched_tokens": 16}
    auto = LLM(str(smollm2_path), **kwargs)
    base = _greedy(auto, PROMPTS)
    auto_blocks = auto.engine.core.num_blocks
    del auto
    with caplog.at_level(logging.INFO, logger="brigade"):
        fp8 = LLM(str(smollm2_path), kv_cache_dtype="fp8", **kwargs)
    runner = fp8.engine.core.executor.worker.model_runner
    assert runner.kv_caches[0].dtype == torch.float8_e4m3fn
    got = _greedy(fp8, PROMPTS)
    stats = fp8.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert fp8.engine.core.num_blocks == 4 * auto_blocks  # 1 byte per element against 4
    lines = [r.getMessage() for r in caplog.records if "fp8" in r.getMessage()]
    assert sum("has no k_scale/v_scale tensors; every layer uses scale 1.0" in line for line in lines) == 1, lines
    assert any("4.0x the blocks of float32, 2.0x of bfloat16" in line for line in lines), lines
    same, drift = _agreement(base, got)
    assert min(same) >= 3 and sum(same) >= 48 and drift < 0.05, (same, drift)


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """A random-weight Llama (2 layers, hidden 64, GQA 4/2 heads, vocab 256) saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, initializer_range=0.2,
                         rms_norm_eps=1e-5, eos_token_id=None, bos_token_id=None, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("tiny-llama-kv-scales")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_kv_scales_from_the_checkpoint_reach_every_layer(tiny_llama_dir, tmp_path, caplog):
    """Per-layer scales sized as llm-compressor sizes them (amax / 448, the amax read from the fp32 cache after the
    same prompts), layer 0 named ``self_attn.k_scale``/``v_scale``, layer 1 ``self_attn.k_proj.output_scale`` /
    ``v_proj.output_scale``: each attention backend holds its two scales; layer 0's cache holds exactly the fp32
    cache's K and V divided by them in e4m3 (layer 0's K/V do not depend on attention); and the greedy tokens
    (3 random prompts x 16, the prompts read back from the cache as prefix-cache hits) equal transformers' with
    its cache round-tripping K/V through e4m3 at the same scales, logprobs within 1e-3."""
    prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 21, 40)]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    kwargs = {"skip_tokenizer_init": True, "max_model_len": 128, "num_gpu_blocks_override": 16}
    auto = LLM(str(tiny_llama_dir), **kwargs)
    _greedy(auto, inputs, 1)  # the prompts' K/V, in fp32
    caches = [c.clone() for c in auto.engine.core.executor.worker.model_runner.kv_caches]
    del auto
    amax = [(float(c[0].abs().max()), float(c[1].abs().max())) for c in caches]
    scales = {"model.layers.0.self_attn.k_scale": amax[0][0] / 448,
              "model.layers.0.self_attn.v_scale": amax[0][1] / 448,
              "model.layers.1.self_attn.k_proj.output_scale": amax[1][0] / 448,
              "model.layers.1.self_attn.v_proj.output_scale": amax[1][1] / 448,
              # FP8-attention checkpoints also carry these: checked, then unused (queries stay in the model dtype)
              "model.layers.0.self_attn.q_scale": 0.02, "model.layers.1.self_attn.prob_scale": 1 / 448}
    path = with_scales(tiny_llama_dir, tmp_path / "scaled", scales)
    with caplog.at_level(logging.INFO, logger="brigade"):
        fp8 = LLM(str(path), kv_cache_dtype="fp8", **kwargs)
    runner = fp8.engine.core.executor.worker.model_runner
    held = [(layer.self_attn.attn.backend.k_scale, layer.self_attn.attn.backend.v_scale)
            for layer in runner.model.model.layers]
    want = [(float(torch.tensor(k / 448)), float(torch.tensor(v / 448))) for k, v in amax]  # fp32 in the file
    assert held == want
    assert any("k_scale/v_scale of 2 of 2 layers from the checkpoint" in r.getMessage() for r in caplog.records)
    assert any("2 q_scale/prob_scale tensor(s) are not used" in r.getMessage() for r in caplog.records)
    _greedy(fp8, inputs, 1)
    layer0 = runner.kv_caches[0]
    for i, scale in enumerate(want[0]):  # the same block ids were handed out in the same order
        assert torch.equal(layer0[i].view(torch.uint8), quantize_kv(caches[0][i], scale).view(torch.uint8))
    got = _greedy(fp8, inputs, 16)
    expected = transformers_fp8_greedy(path, prompts, want, 16)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    worst = max(abs(a - b) for (_, la), (_, lb) in zip(got, expected) for a, b in zip(la, lb))
    assert worst < 1e-3, worst
    stats = fp8.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("value", [math.nan, 0.0, -0.5])
def test_a_bad_kv_scale_is_one_line_at_load(tiny_llama_dir, tmp_path, value):
    path = with_scales(tiny_llama_dir, tmp_path / "bad", {"model.layers.1.self_attn.v_scale": value})
    with pytest.raises(ValueError) as info:
        LLM(str(path), kv_cache_dtype="fp8", skip_tokenizer_init=True, max_model_len=64, num_gpu_blocks_override=8)
    message = str(info.value)
    assert "\n" not in message and message.startswith(
        f"KV-cache scale 'model.layers.1.self_attn.v_scale' is {value}; a scale must be a positive finite number")
