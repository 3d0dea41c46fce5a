"""Layer tests: each op against transformers' own implementation or plain math, and the CustomOp seam."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from brigade.model_executor.layers.activation import SiluAndMul
from brigade.model_executor.layers.custom_op import CustomOp
from brigade.model_executor.layers.layernorm import RMSNorm
from brigade.model_executor.layers.linear import Linear, MergedColumnLinear, QKVLinear
from brigade.model_executor.layers.rotary_embedding import (RopeParameters, RotaryEmbedding, compute_inv_freq,
                                                            get_rope_parameters)
from brigade.model_executor.layers.vocab import LMHead, VocabEmbedding

LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers_and_fuses_residual(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 48, generator=gen).to(dtype)
    residual = torch.randn(7, 48, generator=gen).to(dtype)
    weight = (torch.rand(48, generator=gen) + 0.5).to(dtype)
    ours = RMSNorm(48, 1e-5, dtype=dtype)
    ref = LlamaRMSNorm(48, eps=1e-5).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(weight)
        ref.weight.copy_(weight)
    assert torch.equal(ours(x), ref(x))
    out, new_residual = ours(x, residual)
    assert torch.equal(new_residual, x + residual)
    assert torch.equal(out, ref(x + residual))


def test_silu_and_mul():
    x = torch.randn(5, 2 * 24)
    torch.testing.assert_close(SiluAndMul()(x), F.silu(x[:, :24]) * x[:, 24:], rtol=0, atol=0)


def test_rope_parameters_from_transformers_5_and_4_layouts():
    v5 = transformers.LlamaConfig(rope_parameters=dict(LLAMA31_ROPE))
    v4 = SimpleNamespace(rope_theta=500000.0, rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                            "high_freq_factor": 4.0,
                                                            "original_max_position_embeddings": 8192})
    for cfg in (v5, v4):
        rope = get_rope_parameters(cfg)
        assert (rope.rope_theta, rope.rope_type, rope.scaling["factor"]) == (500000.0, "llama3", 8.0)
    plain = get_rope_parameters(SimpleNamespace(rope_theta=1e5, rope_scaling=None))
    assert (plain.rope_theta, plain.rope_type, plain.scaling) == (1e5, "default", {})
    with pytest.raises(ValueError, match="rope type 'dynamic' is not supported"):
        get_rope_parameters(SimpleNamespace(rope_theta=1e4, rope_scaling={"rope_type": "dynamic", "factor": 4.0}))


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "default", "rope_theta": 100000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    LLAMA31_ROPE,
], ids=["default", "linear", "llama3"])
def test_inv_freq_matches_transformers(rope_parameters):
    cfg = transformers.LlamaConfig(hidden_size=1024, num_attention_heads=8, max_position_embeddings=131072,
                                   rope_parameters=dict(rope_parameters))
    rope = get_rope_parameters(cfg)
    ours = compute_inv_freq(128, rope)
    if rope.rope_type == "default":
        ref = 1.0 / (rope.rope_theta ** (torch.arange(0, 128, 2).float() / 128))
    else:
        ref, _ = ROPE_INIT_FUNCTIONS[rope.rope_type](cfg, torch.device("cpu"))
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    if rope.rope_type == "llama3":
        # Llama 3.1 keeps the highest frequencies and divides the lowest by the factor.
        base = compute_inv_freq(128, RopeParameters(rope_theta=500000.0))
        assert ours[0] == base[0] and torch.isclose(ours[-1], base[-1] / 8.0)


def test_rotary_matches_transformers_neox():
    cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=4096, rope_parameters=dict(LLAMA31_ROPE))
    head_size = 64
    rotary = RotaryEmbedding(head_size, head_size, 4096, get_rope_parameters(cfg))
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 2, 17, 1000, 4095])
    q = torch.randn(6, 4 * head_size, generator=gen)
    k = torch.randn(6, 2 * head_size, generator=gen)
    q_out, k_out = rotary(positions, q, k)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None])  # [1, T, D]
    q_ref, k_ref = apply_rotary_pos_emb(q.view(1, 6, 4, head_size).transpose(1, 2),
                                        k.view(1, 6, 2, head_size).transpose(1, 2), cos, sin)
    torch.testing.assert_close(q_out, q_ref.transpose(1, 2).reshape(6, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, k_ref.transpose(1, 2).reshape(6, -1), rtol=1e-5, atol=1e-5)


def test_rotary_partial_and_gptj_style_leave_the_rest_untouched():
    rotary = RotaryEmbedding(16, 8, 32, RopeParameters(rope_theta=10000.0), is_neox_style=False)
    q = torch.randn(3, 2 * 16)
    k = torch.randn(3, 16)
    q_out, _ = rotary(torch.tensor([0, 5, 9]), q, k)
    q3, q3_out = q.view(3, 2, 16), q_out.view(3, 2, 16)
    assert torch.equal(q3_out[..., 8:], q3[..., 8:])
    assert torch.equal(q3_out[0], q3[0])  # position 0 is the identity rotation
    # GPT-J style rotates adjacent pairs: (x0, x1) by angle p * inv_freq[0].
    angle = torch.tensor(5.0)
    x0, x1 = q3[1, :, 0], q3[1, :, 1]
    torch.testing.assert_close(q3_out[1, :, 0], x0 * angle.cos() - x1 * angle.sin())


def test_qkv_and_merged_weight_loaders_place_each_shard():
    qkv = QKVLinear(8, head_size=2, num_heads=4, num_kv_heads=2, bias=True, dtype=torch.float32)
    q, k, v = torch.full((8, 8), 1.0), torch.full((4, 8), 2.0), torch.full((4, 8), 3.0)
    for shard_id, w in (("v", v), ("q", q), ("k", k)):
        qkv.weight.weight_loader(qkv.weight, w, shard_id)
        qkv.bias.weight_loader(qkv.bias, w[:, 0] * 10, shard_id)
    assert torch.equal(qkv.weight, torch.cat([q, k, v]))
    assert torch.equal(qkv.bias, torch.cat([q, k, v])[:, 0] * 10)
    x = torch.randn(3, 8)
    out_q, out_k, out_v = qkv.split(qkv(x))
    torch.testing.assert_close(out_k, x @ k.T + 20)
    assert out_q.shape == (3, 8) and out_v.shape == (3, 4)
    with pytest.raises(ValueError, match="does not fit"):
        qkv.weight.weight_loader(qkv.weight, torch.zeros(8, 8), "k")
    with pytest.raises(ValueError, match="not 'o'"):
        qkv.weight.weight_loader(qkv.weight, q, "o")

    gate_up = MergedColumnLinear(8, [6, 6], dtype=torch.float32)
    gate_up.weight.weight_loader(gate_up.weight, torch.ones(6, 8), 1)
    gate_up.weight.weight_loader(gate_up.weight, torch.zeros(6, 8), 0)
    assert gate_up.weight[:6].sum() == 0 and gate_up.weight[6:].sum() == 48
    plain = Linear(8, 6, dtype=torch.float32)
    with pytest.raises(ValueError, match="no shards"):
        plain.weight.weight_loader(plain.weight, torch.ones(6, 8), 0)


def test_tied_lm_head_shares_the_embedding_parameter():
    embed = VocabEmbedding(10, 4, dtype=torch.float32)
    head = LMHead(10, 4, dtype=torch.float32)
    head.tie_to(embed)
    with torch.no_grad():
        embed.weight.copy_(torch.arange(40.0).view(10, 4))
    h = embed(torch.tensor([3]))
    torch.testing.assert_close(head(h), h @ embed.weight.T)
    assert head.weight is embed.weight
    with pytest.raises(ValueError, match="cannot tie"):
        LMHead(11, 4, dtype=torch.float32).tie_to(embed)


class _Doubler(CustomOp):
    op_name = "silu_and_mul"  # borrows a real op's name so a "cpu" kernel can be registered for it

    def forward_native(self, x):
        return 2 * x


class _Tripler(_Doubler):
    def forward_native(self, x):
        return 3 * x


def test_custom_op_binds_registered_impl_once_per_device_type():
    from brigade.plugins.kernels import registered_kernel

    def fast(op, x):
        return 2 * x + 1  # distinguishable from forward_native on purpose

    native = _Doubler()
    with registered_kernel("silu_and_mul", "cpu", fast):
        with torch.device("cpu"):
            bound = _Doubler()
            norm, sub = RMSNorm(2), _Tripler()
        with torch.device("meta"):
            elsewhere = _Doubler()  # not the active platform's device type
        assert bound.impl_name == "cpu" and bound(torch.ones(2)).tolist() == [3.0, 3.0]
        assert native.impl_name == "native" and native(torch.ones(2)).tolist() == [2.0, 2.0]
        assert elsewhere.impl_name == "native"
        # Kernels are per op: RMSNorm did not get the doubler's kernel, nor a subclass without its own op name.
        assert norm.impl_name == "native" and sub.impl_name == "native"
    assert _Doubler().impl_name == "native"
