"""The LinearMethod seam, exercised by a small but real weight-only int8 method written here.

The method stores the checkpoint's bf16/fp32 weight, quantizes it per output channel after loading
(a derived ``weight_scale`` that is not in the checkpoint), and dequantizes in ``apply``. The model
must load HF shards into it, skip the layers the config leaves alone, and stay close to the
unquantized logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

from brigade.attention.reference import ReferenceAttentionBackend
from brigade.model_executor.layers.linear_method import LinearMethod, QuantizationConfig
from brigade.model_executor.loader import get_hf_config, process_weights_after_loading
from brigade.model_executor.models.llama import LlamaForCausalLM
from brigade.model_executor.weight_utils import safetensors_weights_iterator, set_weight_attrs


class Int8WeightOnlyMethod(LinearMethod):
    def create_weights(self, layer, *, input_size, output_sizes, dtype):
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=dtype), requires_grad=False)
        set_weight_attrs(weight, {"output_dim": 0})
        layer.register_parameter("weight", weight)
        scale = nn.Parameter(torch.empty(sum(output_sizes), dtype=torch.float32), requires_grad=False)
        set_weight_attrs(scale, {"output_dim": 0, "required_in_checkpoint": False})
        layer.register_parameter("weight_scale", scale)

    def process_weights_after_loading(self, layer):
        w = layer.weight.data.float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        layer.weight_scale.data.copy_(scale)
        layer.weight = nn.Parameter(torch.round(w / scale[:, None]).to(torch.int8), requires_grad=False)

    def apply(self, layer, x, bias):
        w = layer.weight.to(x.dtype) * layer.weight_scale.to(x.dtype)[:, None]
        return F.linear(x, w, bias)


class Int8Config(QuantizationConfig):
    name = "int8-test"

    def __init__(self):
        self.prefixes: list[str] = []

    @classmethod
    def from_hf_config(cls, hf_config):
        return cls()

    def get_linear_method(self, prefix):
        self.prefixes.append(prefix)
        return None if prefix.endswith("o_proj") else Int8WeightOnlyMethod()


def test_quantized_linear_method_loads_hf_shards_and_tracks_unquantized(tmp_path, save_random_hf_model,
                                                                        paged_steps_for):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      architectures=["LlamaForCausalLM"])
    path = save_random_hf_model(tmp_path / "m", config)
    hf_config = get_hf_config(str(path))
    quant_config = Int8Config.from_hf_config(hf_config)
    models = {}
    for name, qc in (("int8", quant_config), ("plain", None)):
        model = LlamaForCausalLM(hf_config, dtype=torch.float32, attn_backend=ReferenceAttentionBackend,
                                 quant_config=qc)
        model.load_weights(safetensors_weights_iterator(str(path)))
        process_weights_after_loading(model)
        models[name] = model
    layer0 = models["int8"].model.layers[0]
    assert layer0.self_attn.qkv_proj.weight.dtype == torch.int8
    assert layer0.mlp.gate_up_proj.weight.dtype == torch.int8
    assert layer0.self_attn.o_proj.weight.dtype == torch.float32  # left unquantized by the config
    assert "model.layers.1.self_attn.qkv_proj" in quant_config.prefixes
    assert "model.layers.1.mlp.gate_up_proj" in quant_config.prefixes
    logits = {}
    for name, model in models.items():
        steps = paged_steps_for(hf_config)
        steps.add_request("a", [6, 2])
        input_ids, positions, ctx = steps.step([("a", [3, 14, 15, 92, 65, 35])])
        with torch.inference_mode():
            logits[name] = model.compute_logits(model(input_ids, positions, ctx))
    err = (logits["int8"] - logits["plain"]).abs().max().item()
    scale = logits["plain"].abs().max().item()
    assert 0 < err < 0.02 * scale  # quantization changed something, but only by rounding noise


def test_dense_gemm_seam_binds_at_construction():
    """A platform's dense GEMM replaces F.linear for layers built afterwards on its device type, only those."""

    from brigade.model_executor.layers.linear import Linear
    from brigade.model_executor.layers.vocab import LMHead
    from brigade.plugins import DuplicateNameError
    from brigade.plugins.kernels import add_kernel, registered_kernel
    from brigade.plugins.registry import PluginSource, Registry

    calls = []

    def counting_gemm(x, weight, bias):
        calls.append(tuple(x.shape))
        return F.linear(x, weight, bias)

    before = Linear(8, 4, dtype=torch.float32)
    with registered_kernel("dense_gemm", "cpu", counting_gemm):
        after = Linear(8, 4, dtype=torch.float32)
        head = LMHead(10, 8, dtype=torch.float32)
    registry, vendor = Registry("kernel"), PluginSource("a", "vendor-a", "1")
    add_kernel(registry, "dense_gemm", "cpu", counting_gemm, vendor)
    add_kernel(registry, "dense_gemm", "cpu", counting_gemm, vendor)  # the same plugin again is fine
    with pytest.raises(DuplicateNameError, match="kernel 'dense_gemm@cpu'.*vendor-b.*vendor-a"):
        add_kernel(registry, "dense_gemm", "cpu", F.linear, PluginSource("b", "vendor-b", "1"))
    for layer in (before, after, head):
        layer.weight.data.normal_()
    x = torch.randn(3, 8)
    assert torch.equal(after(x), F.linear(x, after.weight)) and torch.equal(before(x), F.linear(x, before.weight))
    head(x)
    assert calls == [(3, 8), (3, 8)]  # the layer and head built while it was registered, not the one before


def test_silu_mul_gemm_seam_folds_the_activation_into_the_down_projection():
    """A platform's SiLU-mul GEMM runs the MLP's activation, down projection and residual add as one call where
    it takes the batch (here: one row), gives the unfused result, and the MLP falls back to separate ops when
    it returns None."""
    from brigade.model_executor.layers.activation import SiluAndMul
    from brigade.model_executor.layers.layernorm import RMSNorm
    from brigade.model_executor.models.llama import LlamaMLP
    from brigade.plugins import DuplicateNameError
    from brigade.plugins.kernels import add_kernel, registered_kernel
    from brigade.plugins.registry import PluginSource, Registry

    calls = []

    def one_row_fold(x, weight, bias, *, residual=None):
        if x.shape[0] != 1:
            return None
        calls.append((tuple(x.shape), residual is not None))
        out = F.linear(SiluAndMul().forward_native(x), weight, bias)
        return out if residual is None else residual + out

    registry = Registry("kernel")
    add_kernel(registry, "silu_mul_gemm", "cpu", one_row_fold, PluginSource("a", "vendor-a", "1"))
    with pytest.raises(DuplicateNameError, match="silu_mul_gemm@cpu"):
        add_kernel(registry, "silu_mul_gemm", "cpu", lambda x, w, b, residual=None: None,
                   PluginSource("b", "vendor-b", "1"))
    with registered_kernel("silu_mul_gemm", "cpu", one_row_fold):
        fused = LlamaMLP(16, 40, bias=True, dtype=torch.float32, quant_config=None, prefix="mlp")
    plain = LlamaMLP(16, 40, bias=True, dtype=torch.float32, quant_config=None, prefix="mlp")
    for p in fused.parameters():
        p.data.normal_()
    plain.load_state_dict(fused.state_dict())
    norm = RMSNorm(16, 1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    for rows in (1, 3):
        h, rest = torch.randn(rows, 16), torch.randn(rows, 16)
        for pending in (None, rest):  # the stream is h, or h + rest with the add still pending
            stream = h if pending is None else h + pending
            x = norm.forward_native(stream)
            want = stream + F.linear(SiluAndMul().forward_native(F.linear(x, plain.gate_up_proj.weight,
                                                                          plain.gate_up_proj.bias)),
                                     plain.down_proj.weight, plain.down_proj.bias)
            for mlp in (fused, plain):
                out, left = mlp(h, pending, norm)
                torch.testing.assert_close(out if left is None else out + left, want)
    assert calls == [((1, 80), True)] * 2  # only one-row batches took the fused path, residual included

