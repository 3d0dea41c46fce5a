"""The reference and cpu backends' three routes (decode, fresh prefill, prefill with context) against a naive oracle,
and the rotary seam (``AttentionBackend.forward_rotary``, ``Attention.forward(positions=, rotary_emb=)``).

The oracle keeps each request's whole K/V sequence contiguous and computes causal softmax attention in
float64, one request and one head at a time; the backend reads the same K/V through block tables.
"""

from __future__ import annotations

import pytest
import torch

from brigade.attention.backend import AttentionContext, AttentionMetadata
from brigade.attention.cpu import CpuAttentionBackend
from brigade.attention.reference import ReferenceAttentionBackend
from brigade.model_executor.layers.attention import Attention
from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding


def naive(q, k, v, context_len, scale, group):
    """q: [L, H, D]; k, v: [context_len + L, Hkv, D] -> [L, H, D] (float64)."""
    L, H, _ = q.shape
    out = torch.empty(L, H, q.shape[-1], dtype=torch.float64)
    for h in range(H):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        for i in range(L):
            s = (kh[: context_len + i + 1] @ q[i, h].double()) * scale
            out[i, h] = torch.softmax(s, 0) @ vh[: context_len + i + 1]
    return out


# (context already in the cache, new tokens this step): decodes first, as the runner orders them.
CASES = {
    "decodes": [(5, 1), (40, 1), (16, 1), (0, 1)],
    "fresh": [(0, 7), (0, 7), (0, 20), (0, 1)],
    "context": [(16, 9), (3, 30)],
    "mixed": [(33, 1), (70, 1), (0, 12), (0, 12), (0, 5), (24, 8), (17, 16)],
}


def make_step(reqs, *, H, Hkv, D, bs, num_blocks, dtype, gen):
    """One step's inputs for ``reqs`` [(context already cached, new tokens)], decodes first.

    Returns (query, key, value, kv_cache, metadata, full_k, full_v): full_k/full_v hold each request's
    whole K/V sequence; the cache holds every context and random garbage elsewhere.
    """
    kv_cache = torch.randn(2, num_blocks, bs, Hkv, D, generator=gen).to(dtype)  # garbage outside the tables
    free = torch.randperm(num_blocks - 1, generator=gen).add(1).tolist()  # block 0 stays the null block
    tables, full_k, full_v, slots, q_rows = [], [], [], [], []
    max_blocks = max(-(-(c + n) // bs) for c, n in reqs) + 1
    for ctx, new in reqs:
        total = ctx + new
        blocks = [free.pop() for _ in range(-(-total // bs))]
        tables.append(blocks + [0] * (max_blocks - len(blocks)))
        k = torch.randn(total, Hkv, D, generator=gen).to(dtype)
        v = torch.randn(total, Hkv, D, generator=gen).to(dtype)
        flat = kv_cache.view(2, -1, Hkv, D)
        pos_slots = [blocks[p // bs] * bs + p % bs for p in range(total)]
        flat[0][pos_slots[:ctx]] = k[:ctx]  # the context is already cached
        flat[1][pos_slots[:ctx]] = v[:ctx]
        slots += pos_slots[ctx:]
        full_k.append(k)
        full_v.append(v)
        q_rows.append(torch.randn(new, H, D, generator=gen).to(dtype))
    query = torch.cat(q_rows)
    key = torch.cat([k[c:] for k, (c, _) in zip(full_k, reqs)])
    value = torch.cat([v[c:] for v, (c, _) in zip(full_v, reqs)])
    qlens = torch.tensor([n for _, n in reqs], dtype=torch.int32)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), qlens.cumsum(0).to(torch.int32)])
    seq_lens = torch.tensor([c + n for c, n in reqs], dtype=torch.int32)
    md = AttentionMetadata(
        num_reqs=len(reqs), num_actual_tokens=int(qsl[-1]), max_query_len=int(qlens.max()),
        max_seq_len=int(seq_lens.max()),
        num_decodes=next((i for i, (_, n) in enumerate(reqs) if n != 1), len(reqs)),  # leading 1-token rows
        query_start_loc=qsl, seq_lens=seq_lens, block_table=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64), query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens)
    return query, key, value, kv_cache, md, full_k, full_v


@pytest.mark.parametrize("backend_cls", [ReferenceAttentionBackend, CpuAttentionBackend])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("case", list(CASES))
def test_routes_match_the_naive_oracle(case, dtype, tol, backend_cls):
    gen = torch.Generator().manual_seed(hash(case) % 1000)
    H, Hkv, D, bs, num_blocks = 6, 2, 16, 8, 64
    reqs = CASES[case]
    backend = backend_cls(H, D, Hkv, D ** -0.5)
    if backend_cls is CpuAttentionBackend:
        assert backend.use_kernel, CpuAttentionBackend._kernel_error  # the compiled decode really runs
    query, key, value, kv_cache, md, full_k, full_v = make_step(reqs, H=H, Hkv=Hkv, D=D, bs=bs,
                                                                num_blocks=num_blocks, dtype=dtype, gen=gen)
    out = backend.forward(query, key, value, kv_cache, md)
    assert out.dtype == dtype and out.shape == query.shape
    assert not out.isnan().any()
    start = 0
    for (ctx, new), k, v in zip(reqs, full_k, full_v):
        want = naive(query[start:start + new], k, v, ctx, D ** -0.5, H // Hkv)
        got = out[start:start + new].double()
        assert (got - want).abs().max() <= tol * max(1.0, want.abs().max()), (case, ctx, new)
        start += new
    # The step's K/V were written where the slot mapping says.
    flat = kv_cache.view(2, -1, Hkv, D)
    assert torch.equal(flat[0][md.slot_mapping], key) and torch.equal(flat[1][md.slot_mapping], value)


@pytest.mark.parametrize("backend_cls", [ReferenceAttentionBackend, CpuAttentionBackend])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_default_forward_rotary_is_rotary_then_forward(neox, dtype, backend_cls):
    """The base-class ``forward_rotary`` (not overridden on the CPU) equals the rotary op then ``forward``."""
    gen = torch.Generator().manual_seed(5)
    H, Hkv, D = 6, 2, 16
    query, key, value, kv_cache, md, _, _ = make_step(CASES["mixed"], H=H, Hkv=Hkv, D=D, bs=8, num_blocks=64,
                                                      dtype=dtype, gen=gen)
    rope = RotaryEmbedding(D, 8, 4096, RopeParameters(10000.0), is_neox_style=neox)  # partial rotary
    positions = torch.randint(0, 4096, (query.shape[0],), generator=gen)
    backend = backend_cls(H, D, Hkv, D ** -0.5)
    want_cache = kv_cache.clone()
    q, k = rope(positions, query.reshape(query.shape[0], -1), key.reshape(key.shape[0], -1))
    want = backend.forward(q.view(query.shape), k.view(key.shape), value, want_cache, md)
    got = backend.forward_rotary(positions, query, key, value, kv_cache, md, rope)
    assert torch.equal(got, want) and torch.equal(kv_cache, want_cache)
    assert not torch.equal(q.view(query.shape), query)  # the rotation really happened


def test_attention_layer_hands_the_rotation_to_the_backend():
    """``Attention.forward`` with positions and rotary_emb equals rotating first and calling it without."""
    gen = torch.Generator().manual_seed(9)
    H, Hkv, D = 4, 2, 16
    query, key, value, kv_cache, md, _, _ = make_step([(3, 1), (0, 5)], H=H, Hkv=Hkv, D=D, bs=8, num_blocks=16,
                                                      dtype=torch.float32, gen=gen)
    layer = Attention(H, D, Hkv, scale=D ** -0.5, layer_idx=0, backend_cls=ReferenceAttentionBackend)
    rope = RotaryEmbedding(D, D, 64, RopeParameters(10000.0))
    positions = torch.tensor([3, 0, 1, 2, 3, 4])
    q, k, v = query.flatten(1), key.flatten(1), value.flatten(1)
    want_cache = kv_cache.clone()
    want = layer(*rope(positions, q, k), v, AttentionContext(md, [want_cache]))
    got = layer(q, k, v, AttentionContext(md, [kv_cache]), positions=positions, rotary_emb=rope)
    assert torch.equal(got, want) and torch.equal(kv_cache, want_cache)
    with pytest.raises(ValueError, match="both positions and rotary_emb"):
        layer(q, k, v, AttentionContext(md, [kv_cache]), positions=positions)
