"""brigade-awq without a model: the packed format (AutoAWQ's interleaved nibble order, round trips, against an
independent packer), the quantization_config rules, and AWQ linear layers (merged shards, chunks, bias) against a
dense float64 product."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from awq_checkpoint import autoawq_pack, awq_quantization_config, quantize_awq

from brigade.model_executor.layers.linear import Linear, MergedColumnLinear, QKVLinear
from brigade_awq import packing
from brigade_awq.config import AWQConfig
from brigade_awq.method import AWQLinearMethod
from brigade_awq.packing import dequantize, pack, unpack

# The documented order (AutoAWQ awq/utils/packing_utils.py, vLLM awq_triton.py): nibble i of a word holds
# column AWQ_ORDER[i] of its 8.
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _reference_pack(q: torch.Tensor) -> torch.Tensor:
    """Written from the documented order alone, in Python integers: [rows, out] -> int32 [rows, out / 8]."""
    rows, out = q.shape
    words = []
    for r in range(rows):
        row = []
        for c in range(out // 8):
            word = 0
            for i in range(8):
                word |= int(q[r, c * 8 + AWQ_ORDER[i]]) << (4 * i)
            row.append(word - 2 ** 32 if word >= 2 ** 31 else word)
        words.append(row)
    return torch.tensor(words, dtype=torch.int32)


def _reference_unpack(words: torch.Tensor) -> torch.Tensor:
    rows, cols = words.shape
    out = torch.empty(rows, cols * 8, dtype=torch.int64)
    for r in range(rows):
        for c in range(cols):
            word = int(words[r, c]) & 0xFFFFFFFF
            for i in range(8):
                out[r, c * 8 + AWQ_ORDER[i]] = (word >> (4 * i)) & 0xF
    return out


# ---- the packed format ---------------------------------------------------------------------------------

def test_word_layout_is_awq_interleaved():
    q = torch.arange(1, 9).reshape(1, 8)  # columns 0..7 hold codes 1..8
    # nibbles low to high hold columns 0, 2, 4, 6, 1, 3, 5, 7, i.e. codes 1, 3, 5, 7, 2, 4, 6, 8
    assert pack(q).tolist() == [[0x86427531 - 2 ** 32]]
    assert unpack(torch.tensor([[0x86427531 - 2 ** 32]], dtype=torch.int32)).tolist() == [list(range(1, 9))]


def test_pack_unpack_round_trip_and_match_the_reference():
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (24, 40), generator=gen)
    words = pack(q)
    assert words.dtype == torch.int32 and words.shape == (24, 5)
    assert torch.equal(words, _reference_pack(q))
    assert torch.equal(unpack(words).long(), q)
    assert torch.equal(_reference_unpack(words), q)
    w = torch.randint(-2 ** 31, 2 ** 31, (6, 3), generator=gen, dtype=torch.int64).to(torch.int32)
    assert torch.equal(pack(unpack(w)), w)  # every bit pattern round-trips
    assert torch.equal(unpack(w).long(), _reference_unpack(w))


def test_pack_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="along dim 1 by 8"):
        pack(torch.zeros(2, 12, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack(torch.full((1, 8), 16))


def test_helper_packer_matches_and_dequantize_equals_the_formula():
    gen = torch.Generator().manual_seed(1)
    layer = quantize_awq(torch.randn(48, 64, generator=gen), group_size=16)  # [out 48, in 64]
    t = autoawq_pack(layer)
    assert t["qweight"].shape == (64, 6) and t["qzeros"].shape == (4, 6) and t["scales"].shape == (4, 48)
    assert torch.equal(t["qweight"], pack(layer.q)) and torch.equal(t["qzeros"], pack(layer.zeros))
    w = dequantize(t["qweight"], t["qzeros"], t["scales"], group_size=16)
    assert torch.equal(w, layer.dequantized().T)
    z = layer.zeros.repeat_interleave(16, 0)
    assert torch.equal(w, (layer.q.long() - z).float() * layer.scales.float().repeat_interleave(16, 0))
    assert torch.equal(dequantize(t["qweight"], t["qzeros"], t["scales"], group_size=16, columns=(8, 32)),
                       w[:, 8:32])


# ---- quantization_config ---------------------------------------------------------------------------------

def _hf(qc, layers=2):
    return SimpleNamespace(quantization_config=qc, num_hidden_layers=layers, model_type="llama")


def test_config_reads_autoawq_keys():
    cfg = AWQConfig.from_hf_config(_hf(awq_quantization_config(64)))
    assert (cfg.bits, cfg.group_size, cfg.version, cfg.modules_to_not_convert) == (4, 64, "gemm", [])
    old = AWQConfig.from_hf_config(_hf({"quant_method": "awq", "w_bit": 4, "q_group_size": 128,
                                        "zero_point": True, "version": "GEMM"}))
    assert (old.bits, old.group_size) == (4, 128)
    skip = AWQConfig.from_hf_config(_hf(awq_quantization_config(64, ["layers.1.mlp"])))
    assert skip.get_linear_method("model.layers.1.mlp.gate_up_proj") is None
    assert isinstance(skip.get_linear_method("model.layers.0.mlp.gate_up_proj"), AWQLinearMethod)
    part = AWQConfig.from_hf_config(_hf(awq_quantization_config(64, ["layers.0.self_attn.k_proj"])))
    with pytest.raises(ValueError, match="only some of the projections merged into .*qkv_proj"):
        part.get_linear_method("model.layers.0.self_attn.qkv_proj")


@pytest.mark.parametrize("change,needle", [
    ({"bits": 8}, "AWQ bits=8 is not supported; brigade-awq runs AutoAWQ GEMM checkpoints: bits 4"),
    ({"bits": 3}, "AWQ bits=3 is not supported"),
    ({"zero_point": False}, "AWQ zero_point=false (symmetric, no qzeros) is not supported; brigade-awq runs"),
    ({"version": "gemv"}, "AWQ version 'gemv' is not supported"),
    ({"version": "marlin"}, "AWQ version 'marlin' is not supported"),
    ({"version": "exllama"}, "AWQ version 'exllama' is not supported"),
    ({"group_size": -1}, "AWQ group_size=-1 is not supported"),
    ({"modules_to_not_convert": ["visual"]}, "AWQ modules_to_not_convert names 'visual', which is no module"),
    ({"modules_to_not_convert": ["model.layers.7.mlp"]}, "names 'model.layers.7.mlp', which is no module"),
    ({"quant_method": "gptq"}, "--quantization awq cannot load this checkpoint: its quantization_config has "
                               "quant_method 'gptq'"),
])
def test_unsupported_configs_are_one_line(change, needle):
    with pytest.raises(ValueError) as info:
        AWQConfig.from_hf_config(_hf({**awq_quantization_config(64), **change}))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_unquantized_checkpoint_is_one_line():
    with pytest.raises(ValueError, match="--quantization awq needs an AWQ checkpoint"):
        AWQConfig.from_hf_config(_hf(None))


# ---- layers --------------------------------------------------------------------------------------------

def _method(group_size: int) -> AWQLinearMethod:
    return AWQConfig(4, group_size).get_linear_method("model.layers.0.test")


def test_qkv_layer_loads_shards_and_matches_the_dense_product():
    hidden, head, heads, kv_heads, gs = 96, 8, 4, 2, 32
    gen = torch.Generator().manual_seed(7)
    shards = {sid: quantize_awq(torch.randn(n * head, hidden, generator=gen), gs)
              for sid, n in zip("qkv", (heads, kv_heads, kv_heads))}
    layer = QKVLinear(hidden, head, heads, kv_heads, bias=True, dtype=torch.float32, quant_method=_method(gs))
    bias = {sid: torch.randn(q.scales.shape[1], generator=gen) for sid, q in shards.items()}
    for sid, q in shards.items():
        for name, tensor in autoawq_pack(q).items():
            param = getattr(layer, name)
            param.weight_loader(param, tensor, sid)
        layer.bias.weight_loader(layer.bias, bias[sid], sid)
    layer.quant_method.process_weights_after_loading(layer)
    assert {n for n, _ in layer.named_parameters()} == {"qweight", "qzeros", "scales", "bias"}
    dense = torch.cat([q.dequantized() for q in shards.values()])
    x = torch.randn(5, hidden, generator=gen)
    want = x.double() @ dense.double().T + torch.cat(list(bias.values())).double()
    got = layer(x)
    assert got.shape == (5, (heads + 2 * kv_heads) * head) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_gate_up_layer_and_chunked_dequantization(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    shards = [quantize_awq(torch.randn(32, 64, generator=gen), 16) for _ in range(2)]
    layer = MergedColumnLinear(64, [32, 32], dtype=torch.float32, quant_method=_method(16))
    for sid, q in enumerate(shards):
        for name, tensor in autoawq_pack(q).items():
            getattr(layer, name).weight_loader(getattr(layer, name), tensor, sid)
    x = torch.randn(3, 64, generator=gen)
    whole = layer(x)
    dense = torch.cat([q.dequantized() for q in shards])
    torch.testing.assert_close(whole.double(), x.double() @ dense.double().T, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(packing, "DEQUANT_CHUNK_BYTES", 64 * 4 * 16)  # 16 columns at a time: 4 chunks
    assert torch.equal(layer(x), whole)


@pytest.mark.parametrize("args,needle", [
    ((80, 16), "in_features 80 is not a multiple of group_size 32"),
    ((64, 12), "out_features 12 (of [12]) is not a multiple of 8"),
])
def test_layers_that_do_not_pack_are_one_line(args, needle):
    with pytest.raises(ValueError) as info:
        Linear(*args, dtype=torch.float32, quant_method=_method(32))
    assert needle in str(info.value) and "\n" not in str(info.value)
