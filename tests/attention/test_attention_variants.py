"""Sliding windows, logit soft-capping and attention sinks in the reference and cpu backends.

Every route (decode, fresh prefill, prefill with cached context) of one mixed step is checked against the dense
float64 oracle of ``tests/dense_attention.py``; the oracle's conventions are checked against transformers' own
Mistral sliding-window model and its Gemma 2 and gpt-oss attention functions.
"""

from __future__ import annotations

import pytest
import torch
from dense_attention import STEP, VARIANTS, dense_attention, make_step

from brigade.attention import cpu_kernels
from brigade.attention.cpu import CpuAttentionBackend
from brigade.attention.fp8_kv import FP8_KV_DTYPE
from brigade.attention.reference import ReferenceAttentionBackend
from brigade.attention.variants import attend, causal_mask

H, HKV, D, BS = 6, 2, 16, 16


def _check(out, want, tol):
    assert not out.isnan().any()
    err = (out.double() - want).abs().max()
    assert err <= tol * max(1.0, want.abs().max()), float(err)


@pytest.mark.parametrize("backend_cls", [ReferenceAttentionBackend, CpuAttentionBackend], ids=lambda c: c.name)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mixed_step_matches_the_dense_oracle(variant, dtype, tol, backend_cls):
    gen = torch.Generator().manual_seed(hash(variant) % 1000)
    kwargs = VARIANTS[variant].backend_kwargs(H, gen)
    backend = backend_cls(H, D, HKV, D ** -0.5, **kwargs)
    if backend_cls is CpuAttentionBackend:
        assert backend.use_kernel, CpuAttentionBackend._kernel_error  # the compiled decode really runs
    step = make_step(STEP, H=H, Hkv=HKV, D=D, bs=BS, dtype=dtype, gen=gen)
    out = backend.forward(step.query, step.key, step.value, step.kv_cache, step.metadata)
    assert out.dtype == dtype and out.shape == step.query.shape
    _check(out, step.expected(STEP, D ** -0.5, kwargs), tol)


@pytest.mark.parametrize("backend_cls", [ReferenceAttentionBackend, CpuAttentionBackend], ids=lambda c: c.name)
@pytest.mark.parametrize("variant", ["window", "all"])
def test_fp8_kv_cache_with_variants(variant, backend_cls):
    """A float8 cache: the oracle attends to the K/V as the cache returns them (rounded through e4m3)."""
    gen = torch.Generator().manual_seed(3)
    kwargs = VARIANTS[variant].backend_kwargs(H, gen)
    backend = backend_cls(H, D, HKV, D ** -0.5, **kwargs)
    backend.k_scale, backend.v_scale = 0.5, 2.0
    step = make_step(STEP, H=H, Hkv=HKV, D=D, bs=BS, dtype=torch.float32, gen=gen, kv_dtype=FP8_KV_DTYPE,
                     k_scale=0.5, v_scale=2.0)
    out = backend.forward(step.query, step.key, step.value, step.kv_cache, step.metadata)
    _check(out, step.expected(STEP, D ** -0.5, kwargs), 1e-4)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compiled_decode_matches_the_oracle(variant):
    """The C decode kernel alone, with windows shorter, equal to and longer than a block, and contexts inside."""
    gen = torch.Generator().manual_seed(11)
    kwargs = VARIANTS[variant].backend_kwargs(H, gen)
    reqs = [(200, 1), (47, 1), (15, 1), (16, 1), (0, 1), (19, 1)]
    step = make_step(reqs, H=H, Hkv=HKV, D=D, bs=BS, dtype=torch.float32, gen=gen)
    md = step.metadata
    # The decode kernel reads the cache only: write this step's K/V first, as forward does.
    flat = step.kv_cache.view(2, -1, HKV, D)
    flat[0][md.slot_mapping], flat[1][md.slot_mapping] = step.key, step.value
    out = cpu_kernels.decode_attention(step.query, step.kv_cache, md.block_table, md.seq_lens_cpu, D ** -0.5, HKV,
                                       **kwargs)
    _check(out, step.expected(reqs, D ** -0.5, kwargs), 1e-5)


def test_sliding_window_is_transformers_mistral_window():
    """A tiny Mistral with a 5-token window: each query's nonzero attention weights are exactly ``causal_mask``'s."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=5,
                                        max_position_embeddings=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.MistralModel(config).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 64, (1, 13)), output_attentions=True)
    pos = torch.arange(13)
    want = causal_mask(pos[:, None], pos[None, :], 5)
    for weights in out.attentions:  # [1, H, 13, 13]
        assert torch.equal(weights[0] > 0, want.expand(4, -1, -1))
    assert want.sum(-1).tolist() == [1, 2, 3, 4] + [5] * 9  # the window counts the query's own key


def _attrs(attrs):
    """A module carrying ``attrs``, as transformers' attention functions read them off the layer."""
    module = torch.nn.Module()
    for name, value in attrs.items():
        setattr(module, name, value)
    return module.eval()


def test_soft_cap_and_sinks_are_transformers_gemma2_and_gpt_oss():
    """``variants.attend`` against transformers' Gemma 2 (soft cap) and gpt-oss (sinks) eager attention."""
    pytest.importorskip("transformers")
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_attention
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_attention

    gen = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(2, 4, 9, 8, generator=gen) * 3, torch.randn(2, 2, 9, 8, generator=gen) * 3, \
        torch.randn(2, 2, 9, 8, generator=gen)
    pos = torch.arange(9)
    mask = causal_mask(pos[:, None], pos[None, :], 4)  # [9, 9]
    additive = torch.zeros(9, 9).masked_fill(~mask, float("-inf"))[None, None].expand(2, 1, 9, 9)
    sinks = torch.randn(4, generator=gen)
    want, _ = gemma2_attention(_attrs({"num_key_value_groups": 2}), q, k, v, additive, dropout=0.0,
                               scaling=0.3, softcap=1.5)
    got = attend(q, k, v, mask, 0.3, logits_soft_cap=1.5)
    torch.testing.assert_close(got.transpose(1, 2), want)
    want, _ = gpt_oss_attention(_attrs({"num_key_value_groups": 2, "sinks": sinks}), q, k, v, additive,
                                scaling=0.3, dropout=0.0)
    got = attend(q, k, v, mask, 0.3, sinks=sinks)
    torch.testing.assert_close(got.transpose(1, 2), want)
    # The dense oracle agrees with both.
    oracle = dense_attention(q[1].transpose(0, 1), k[1].transpose(0, 1), v[1].transpose(0, 1), 0, 0.3,
                             sliding_window=4, sinks=sinks)
    torch.testing.assert_close(oracle.float(), want[1])
