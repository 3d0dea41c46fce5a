"""GPU checks of the fused rotary + KV-write kernel against the two kernels it replaces.

Skipped as a whole on machines without CUDA (CI); run on the H200 with ``pytest tests/cuda``. The fused
kernel does the same fp32 arithmetic as ``rotary_embedding`` followed by ``write_kv_cache``, so Q, K and
the whole cache must be bit-identical (``torch.equal``), padding slots (-1) included.
"""

from __future__ import annotations

import zlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding  # noqa: E402
from brigade_cuda.attention import TritonAttentionBackend, rotary_write_kv_cache, write_kv_cache  # noqa: E402
from brigade_cuda.attention import triton_backend  # noqa: E402
from brigade_cuda.ops.rotary import rotary_embedding  # noqa: E402

LLAMA3_ROPE = RopeParameters(500000.0, "llama3", scaling={
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})

# (num_heads, num_kv_heads, head_size, rotary_dim): Llama-3-8B, a small GQA head, partial rotary, head 80.
SHAPES = [(32, 8, 128, 128), (14, 2, 64, 64), (8, 8, 128, 64), (12, 4, 80, 80)]


def _split(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_size: int):
    """Q, K, V as [T, heads, head_size] column views of a fused QKV output, as the attention layer sees them."""
    q, k, v = qkv.split([num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size], dim=1)
    t = qkv.shape[0]
    return q.view(t, num_heads, head_size), k.view(t, num_kv_heads, head_size), v.view(t, num_kv_heads, head_size)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "{}q{}kv-d{}-rot{}".format(*s))
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
def test_fused_equals_rotary_then_kv_write(num_tokens, shape, neox, dtype):
    num_heads, num_kv_heads, head_size, rotary_dim = shape
    gen = torch.Generator().manual_seed(zlib.crc32(f"{num_tokens}-{shape}-{neox}-{dtype}".encode()))
    rope = RotaryEmbedding(head_size, rotary_dim, 10000, LLAMA3_ROPE, is_neox_style=neox).cuda()
    block_size, num_blocks = 16, num_tokens // 16 + 5
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, generator=gen).to(dtype).cuda()
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=gen).to(dtype).cuda()
    positions = torch.randint(0, 10000, (num_tokens,), generator=gen).cuda()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].cuda()
    slots[num_tokens // 2] = -1  # a padding row: rotated, not cached

    qkv_ref, cache_ref = qkv.clone(), cache.clone()
    q, k, v = _split(qkv_ref, num_heads, num_kv_heads, head_size)
    rotary_embedding(positions, q, k, head_size, rope.cos_sin_cache, is_neox_style=neox)
    write_kv_cache(k, v, cache_ref, slots)

    q, k, v = _split(qkv, num_heads, num_kv_heads, head_size)
    rotary_write_kv_cache(positions, q, k, v, cache, slots, rope.cos_sin_cache, is_neox_style=neox)
    torch.cuda.synchronize()
    assert torch.equal(qkv, qkv_ref), "rotated Q/K (or V) differ from the rotary kernel's"
    assert torch.equal(cache, cache_ref), "KV cache differs from rotary + write_kv_cache"


def test_fused_refuses_layouts_it_cannot_address():
    rope = RotaryEmbedding(64, 64, 128, LLAMA3_ROPE).cuda()
    q, k, v = (torch.randn(3, h, 64, device="cuda") for h in (4, 2, 2))
    cache = torch.randn(2, 4, 16, 2, 64, device="cuda")
    slots = torch.arange(3, device="cuda")
    positions = torch.arange(3, device="cuda")
    with pytest.raises(ValueError, match="contiguous last dimension"):
        rotary_write_kv_cache(positions, q, k.transpose(1, 2).contiguous().transpose(1, 2), v, cache, slots,
                              rope.cos_sin_cache)
    with pytest.raises(ValueError, match="heads"):
        rotary_write_kv_cache(positions, q, q, v, cache, slots, rope.cos_sin_cache)
    with pytest.raises(ValueError, match="contiguously"):
        rotary_write_kv_cache(positions, q, k, v, cache.transpose(1, 2), slots, rope.cos_sin_cache)


def _step(paged_batch_factory, dtype, gen):
    """Two decodes, a CUDA-graph padding decode (seq_len 0, slot -1) and a prefill."""
    batch = paged_batch_factory([1, 1, 1, 37], [100, 2000, 5, 0], num_heads=32, num_kv_heads=8, head_size=128,
                                block_size=16, dtype=dtype, device="cuda", generator=gen)
    batch.metadata.seq_lens[2] = 0
    batch.metadata.slot_mapping[2] = -1
    decode_positions = (batch.metadata.seq_lens[:3].long() - 1).clamp(min=0)
    return batch, torch.cat([decode_positions, torch.arange(37, device="cuda")])


def _inputs(batch):
    return batch.query.clone(), batch.key.clone(), batch.value.clone(), batch.kv_cache.clone()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "BRIGADE_CUDA_FUSED_ROPE_KV=0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_backend_forward_rotary_equals_rotary_then_forward(dtype, fused, paged_batch_factory, cuda_ops_registered,
                                                           monkeypatch):
    monkeypatch.setenv("BRIGADE_CUDA_FUSED_ROPE_KV", "1" if fused else "0")
    triton_backend.fused_rope_kv_enabled.cache_clear()
    calls = []
    real = triton_backend.rotary_write_kv_cache
    monkeypatch.setattr(triton_backend, "rotary_write_kv_cache", lambda *a, **kw: (calls.append(1), real(*a, **kw)))
    try:
        with torch.device("cuda"):
            rope = RotaryEmbedding(128, 128, 8192, LLAMA3_ROPE)
        assert rope.impl_name == "cuda"  # the unfused path runs the Triton rotary kernel
        batch, positions = _step(paged_batch_factory, dtype, torch.Generator().manual_seed(17))
        backend = TritonAttentionBackend(32, 128, 8, 128 ** -0.5)
        q, k, v, cache_ref = _inputs(batch)
        rotary_embedding(positions, q, k, 128, rope.cos_sin_cache)
        want = backend.forward(q, k, v, cache_ref, batch.metadata)
        q2, k2, v2, cache = _inputs(batch)
        got = backend.forward_rotary(positions, q2, k2, v2, cache, batch.metadata, rope)
        torch.cuda.synchronize()
        assert len(calls) == (1 if fused else 0)
        assert torch.equal(got, want) and torch.equal(cache, cache_ref)
    finally:
        monkeypatch.undo()
        triton_backend.fused_rope_kv_enabled.cache_clear()


def test_forward_rotary_replays_in_cuda_graph(paged_batch_factory, cuda_ops_registered, monkeypatch):
    """Captured (so with PDL on sm_90+), the fused rotary + KV-write decode step (BRIGADE_CUDA_DECODE_ROPE=0)
    matches the eager two-kernel path bit for bit."""
    monkeypatch.setenv("BRIGADE_CUDA_DECODE_ROPE", "0")
    triton_backend.decode_rope_enabled.cache_clear()
    try:
        _check_forward_rotary_replay(paged_batch_factory)
    finally:
        monkeypatch.undo()
        triton_backend.decode_rope_enabled.cache_clear()


def _check_forward_rotary_replay(paged_batch_factory):
    with torch.device("cuda"):
        rope = RotaryEmbedding(128, 128, 8192, LLAMA3_ROPE)
    gen = torch.Generator().manual_seed(23)
    batch = paged_batch_factory([1] * 4, [10, 300, 1200, 0], num_heads=32, num_kv_heads=8, head_size=128,
                                block_size=16, dtype=torch.bfloat16, device="cuda", generator=gen)
    md = batch.metadata
    md.seq_lens[3] = 0  # a padding request
    md.slot_mapping[3] = -1
    positions = (md.seq_lens.long() - 1).clamp(min=0)
    backend = TritonAttentionBackend(32, 128, 8, 128 ** -0.5, decode_num_splits=8)
    q, k, v, cache_ref = _inputs(batch)
    rotary_embedding(positions, q, k, 128, rope.cos_sin_cache)
    want = backend.forward(q, k, v, cache_ref, md)

    out, cache = _captured_forward_rotary(backend, batch, positions, rope)
    assert torch.equal(cache, cache_ref) and torch.equal(out, want)


def _captured_forward_rotary(backend, batch, positions, rope):
    """``forward_rotary`` captured in a CUDA graph (compiled outside it), replayed on fresh, unrotated
    copies of the batch's inputs: (output, cache) after the replay."""
    q, k, v, cache = _inputs(batch)
    backend.forward_rotary(positions, q, k, v, cache, batch.metadata, rope)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward_rotary(positions, q, k, v, cache, batch.metadata, rope)
    for dst, src in zip((q, k, v, cache), _inputs(batch)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    return out, cache


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("splits", [1, 3, 8, 32])
@pytest.mark.parametrize("neox,rotary_dim", [(True, 128), (False, 128), (True, 64)], ids=["neox", "gptj", "partial"])
def test_decode_rope_equals_rotary_kv_write_then_decode(dtype, splits, neox, rotary_dim, paged_batch_factory,
                                                        cuda_ops_registered, monkeypatch, rel_err):
    """BRIGADE_CUDA_DECODE_ROPE (the default): a pure-decode step rotates, writes its K/V and attends in the decode kernel
    itself; the cache is bit-identical to the two-kernel path and the output equal to bf16/fp32 rounding."""
    monkeypatch.setenv("BRIGADE_CUDA_DECODE_ROPE", "1")
    triton_backend.decode_rope_enabled.cache_clear()
    calls = []
    real = triton_backend.decode_attention
    monkeypatch.setattr(triton_backend, "decode_attention", lambda *a, **kw: (calls.append(kw.get("rope")),
                                                                              real(*a, **kw)))
    try:
        with torch.device("cuda"):
            rope = RotaryEmbedding(128, rotary_dim, 8192, LLAMA3_ROPE, is_neox_style=neox)
        gen = torch.Generator().manual_seed(splits)
        # Contexts around tile and split edges, and a padding row (seq_len 0, slot -1).
        batch = paged_batch_factory([1] * 6, [63, 64, 128, 1000, 4000, 0], num_heads=32, num_kv_heads=8,
                                    head_size=128, block_size=16, dtype=dtype, device="cuda", generator=gen)
        md = batch.metadata
        md.seq_lens[5] = 0
        md.slot_mapping[5] = -1
        positions = (md.seq_lens.long() - 1).clamp(min=0)
        backend = TritonAttentionBackend(32, 128, 8, 128 ** -0.5, decode_num_splits=splits)
        q, k, v, cache_ref = _inputs(batch)
        rotary_write_kv_cache(positions, q, k, v, cache_ref, md.slot_mapping, rope.cos_sin_cache, is_neox_style=neox)
        want = backend.forward(q, k, v, cache_ref.clone(), md)  # the cache already holds this step's K/V
        q2, k2, v2, cache = _inputs(batch)
        calls.clear()
        got = backend.forward_rotary(positions, q2, k2, v2, cache, md, rope)
        torch.cuda.synchronize()
        assert len(calls) == 1 and calls[0] is not None  # the rope path ran, in one decode call
        # The same rotation, written per channel: equal but for a rare last-bit difference (FMA contraction).
        assert (cache != cache_ref).float().mean() < 1e-3 and rel_err(cache, cache_ref) < 1e-3
        assert torch.equal(got[5], torch.zeros_like(got[5]))
        assert rel_err(got[:5], want[:5]) < (1e-2 if dtype == torch.bfloat16 else 1e-5)
    finally:
        monkeypatch.undo()
        triton_backend.decode_rope_enabled.cache_clear()


def test_decode_rope_replays_in_cuda_graph(paged_batch_factory, cuda_ops_registered, monkeypatch, rel_err):
    """Captured (with PDL on sm_90+) and replayed on new inputs, the one-kernel decode step stays correct."""
    monkeypatch.setenv("BRIGADE_CUDA_DECODE_ROPE", "1")
    triton_backend.decode_rope_enabled.cache_clear()
    try:
        with torch.device("cuda"):
            rope = RotaryEmbedding(128, 128, 8192, LLAMA3_ROPE)
        batch = paged_batch_factory([1] * 4, [10, 300, 1200, 0], num_heads=32, num_kv_heads=8, head_size=128,
                                    block_size=16, dtype=torch.bfloat16, device="cuda",
                                    generator=torch.Generator().manual_seed(29))
        md = batch.metadata
        md.seq_lens[3] = 0
        md.slot_mapping[3] = -1
        positions = (md.seq_lens.long() - 1).clamp(min=0)
        backend = TritonAttentionBackend(32, 128, 8, 128 ** -0.5, decode_num_splits=8)
        q, k, v, cache_ref = _inputs(batch)
        rotary_write_kv_cache(positions, q, k, v, cache_ref, md.slot_mapping, rope.cos_sin_cache)
        want = backend.forward(q, k, v, cache_ref.clone(), md)
        out, cache = _captured_forward_rotary(backend, batch, positions, rope)
        assert rel_err(cache, cache_ref) < 1e-3 and rel_err(out[:3], want[:3]) < 1e-2
    finally:
        monkeypatch.undo()
        triton_backend.decode_rope_enabled.cache_clear()
