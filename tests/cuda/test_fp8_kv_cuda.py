"""GPU checks of the fp8 KV cache (``--kv-cache-dtype fp8``): the Triton backend's KV_FP8 kernels against the
reference backend on the same float8 e4m3 cache, dequantized (bf16 queries), and the engine with an fp8 cache on a
tiny random Llama against transformers on the CPU with its cache round-tripped through e4m3 at the same scales.

Skipped as a whole on machines without CUDA (CI, where tests/attention/test_triton_backend_interpreted.py checks
the kernels' logic under Triton's interpreter); run on the H200 with ``pytest tests/cuda/test_fp8_kv_cuda.py``.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.attention.fp8_kv import dequantize_kv, quantize_kv, round_trip_kv  # noqa: E402
from brigade.attention.reference import ReferenceAttentionBackend, write_kv_cache  # noqa: E402
from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding  # noqa: E402
from brigade_cuda.attention import TritonAttentionBackend  # noqa: E402

K_SCALE, V_SCALE = 0.03, 0.02
MIXES = {  # (query_lens, context_lens), decodes first
    "decode": ([1] * 6, [0, 15, 255, 1000, 3001, 8200]),
    "prefill": ([2, 37, 300], [0, 0, 0]),
    "mixed": ([1, 1, 50, 257], [999, 4000, 0, 300]),
}


def _fp8_batch(mix: str, factory):
    q_lens, ctx_lens = MIXES[mix]
    gen = torch.Generator().manual_seed(zlib.crc32(f"fp8-{mix}".encode()))
    batch = factory(q_lens, ctx_lens, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                    dtype=torch.bfloat16, device="cuda", generator=gen)
    batch.key[::7, :, :4] *= 30.0  # past 448 * K_SCALE: the writes saturate
    batch.kv_cache = torch.stack([quantize_kv(batch.kv_cache[0], K_SCALE), quantize_kv(batch.kv_cache[1], V_SCALE)])
    return batch


def _backends(splits: int | None = None):
    ref = ReferenceAttentionBackend(32, 128, 8, 128 ** -0.5)
    got = TritonAttentionBackend(32, 128, 8, 128 ** -0.5, decode_num_splits=splits)
    for backend in (ref, got):
        backend.k_scale, backend.v_scale = K_SCALE, V_SCALE
    return ref, got


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "mixed_graph"])
@pytest.mark.parametrize("mix", list(MIXES))
def test_fp8_cache_attention_matches_the_reference_on_the_dequantized_cache(mix, graph, paged_batch_factory,
                                                                            rel_err):
    """The plain KV write (byte-equal to the reference's), then decode (split-KV) and prefill, or a mixed-step
    graph's varlen kernel: bf16 outputs within 2e-2 of the reference backend (fp32) over the same fp8 cache, and
    of the bf16 kernels over a bf16 cache holding the dequantized values."""
    batch = _fp8_batch(mix, paged_batch_factory)
    md = dataclasses.replace(batch.metadata, mixed_graph=graph)
    ref_b, got_b = _backends()
    ref_cache, got_cache, expected_cache = batch.kv_cache.clone(), batch.kv_cache.clone(), batch.kv_cache.clone()
    ref = ref_b.forward(batch.query.float(), batch.key.float(), batch.value.float(), ref_cache, batch.metadata)
    write_kv_cache(batch.key, batch.value, expected_cache, md.slot_mapping, K_SCALE, V_SCALE)
    out = got_b.forward(batch.query, batch.key, batch.value, got_cache, md)
    torch.cuda.synchronize()
    assert torch.equal(got_cache.view(torch.uint8), expected_cache.view(torch.uint8)), "fp8 KV write differs"
    n = md.num_actual_tokens
    err = rel_err(out[:n], ref[:n])
    assert err < 2e-2, f"relative error {err:.2e} against the reference on the fp8 cache"
    bf16_cache = torch.stack([dequantize_kv(batch.kv_cache[0], K_SCALE, torch.bfloat16),
                              dequantize_kv(batch.kv_cache[1], V_SCALE, torch.bfloat16)])
    plain = TritonAttentionBackend(32, 128, 8, 128 ** -0.5).forward(
        batch.query, round_trip_kv(batch.key, K_SCALE), round_trip_kv(batch.value, V_SCALE), bf16_cache, md)
    drift = rel_err(out[:n], plain[:n])
    assert drift < 2e-2, f"against bf16 attention on the dequantized cache: relative error {drift:.2e}"


@pytest.mark.parametrize("mix", ["decode", "mixed"])
def test_fp8_cache_rotary_paths(mix, paged_batch_factory, rel_err, cuda_ops_registered):
    """``forward_rotary``: pure decodes rotate and write the new K/V inside the decode kernel, mixed steps through the
    fused rotary + KV-write kernel; against the reference's rotary op then forward on the same fp8 cache."""
    batch = _fp8_batch(mix, paged_batch_factory)
    md = batch.metadata
    q_lens, ctx_lens = MIXES[mix]
    positions = torch.cat([torch.arange(c, c + q) for q, c in zip(q_lens, ctx_lens)]).cuda()
    rope = RotaryEmbedding(128, 128, 16384, RopeParameters(rope_theta=500000.0)).cuda()
    ref_b, got_b = _backends(splits=4)
    ref_cache, got_cache = batch.kv_cache.clone(), batch.kv_cache.clone()
    ref = ref_b.forward_rotary(positions, batch.query.float(), batch.key.float(), batch.value.float(), ref_cache, md,
                               rope)
    out = got_b.forward_rotary(positions, batch.query.clone(), batch.key.clone(), batch.value, got_cache, md, rope)
    torch.cuda.synchronize()
    written = md.slot_mapping
    for i, scale in enumerate((K_SCALE, V_SCALE)):  # bf16 rotation against fp32: a rounding step apart at most
        got_rows = dequantize_kv(got_cache[i].flatten(0, 1)[written], scale, torch.float32)
        ref_rows = dequantize_kv(ref_cache[i].flatten(0, 1)[written], scale, torch.float32)
        assert rel_err(got_rows, ref_rows) < 5e-2
    err = rel_err(out[:md.num_actual_tokens], ref[:md.num_actual_tokens])
    assert err < 3e-2, f"relative error {err:.2e}"


@pytest.fixture(scope="module")
def tiny_llama_fp8(tmp_path_factory):
    """The tiny random Llama of the engine GPU tests with per-layer k/v scales in its checkpoint, and transformers'
    greedy tokens (CPU, fp32) with its cache round-tripped through e4m3 at those scales."""
    from fp8_kv_reference import transformers_fp8_greedy, with_scales
    from tiny_llama import tiny_llama_config
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_llama_config()
    base = tmp_path_factory.mktemp("tiny-llama-fp8-kv")
    LlamaForCausalLM(config).save_pretrained(base / "plain")
    scales = [(0.01 * (i + 1), 0.005 * (i + 1)) for i in range(config.num_hidden_layers)]
    path = with_scales(base / "plain", base / "scaled",
                       {f"model.layers.{i}.self_attn.{which}_scale": value
                        for i, pair in enumerate(scales) for which, value in zip("kv", pair)})
    held = [(float(torch.tensor(k)), float(torch.tensor(v))) for k, v in scales]  # as fp32 in the file
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (3, 40, 129, 250)]
    expected = [tokens for tokens, _ in transformers_fp8_greedy(path, prompts, held, 24)]
    return str(path), prompts, expected, held


@pytest.mark.parametrize("kwargs", [
    {},  # decode and mixed-step CUDA graphs, overlapped scheduling
    {"enforce_eager": True},
    {"max_num_batched_tokens": 64},  # chunked prefill: prompts read back from the fp8 cache
], ids=["cudagraphs", "eager", "chunked"])
def test_engine_with_fp8_kv_matches_the_cpu_round_trip_reference(tiny_llama_fp8, kwargs):
    """Brigade on CUDA in fp32 with ``kv_cache_dtype="fp8"``: the checkpoint's scales reach every layer, greedy tokens
    equal transformers' (CPU, fp32, K/V round-tripped through e4m3 at the same scales), blocks all come back."""
    from brigade import LLM, SamplingParams

    path, prompts, expected, held = tiny_llama_fp8
    llm = LLM(path, dtype="float32", kv_cache_dtype="fp8", skip_tokenizer_init=True, kv_cache_memory_gib=1,
              max_model_len=512, **kwargs)
    runner = llm.engine.core.executor.worker.model_runner
    assert runner.attn_backend.name == "triton" and runner.kv_caches[0].dtype == torch.float8_e4m3fn
    assert [(layer.self_attn.attn.backend.k_scale, layer.self_attn.attn.backend.v_scale)
            for layer in runner.model.model.layers] == held
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    del llm, runner
    torch.cuda.empty_cache()


def test_fp8_pool_holds_twice_the_bf16_blocks(tiny_llama_fp8):
    from brigade import LLM

    path = tiny_llama_fp8[0]
    blocks = {}
    for cache_dtype in ("auto", "fp8"):
        llm = LLM(path, dtype="bfloat16", kv_cache_dtype=cache_dtype, skip_tokenizer_init=True,
                  kv_cache_memory_gib=0.5, max_model_len=512, enforce_eager=True)
        blocks[cache_dtype] = llm.engine.core.num_blocks
        del llm
        torch.cuda.empty_cache()
    assert blocks["fp8"] == 2 * blocks["auto"], blocks
