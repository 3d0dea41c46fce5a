"""The start-up line naming which quantization method holds each layer family, on tiny Llama models."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from brigade.attention.reference import ReferenceAttentionBackend
from brigade.config import ModelConfig
from brigade.model_executor.layers.linear_method import QuantizationConfig
from brigade.model_executor.loader import get_hf_config, get_model_class, get_quant_config, load_model
from brigade.model_executor.quant_summary import quantization_summary

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, architectures=["LlamaForCausalLM"])
FAMILIES = "qkv_proj, o_proj, gate_up_proj and down_proj"


@pytest.fixture
def hf_config(tmp_path):
    transformers.LlamaConfig(**TINY, tie_word_embeddings=False).save_pretrained(str(tmp_path))
    return get_hf_config(str(tmp_path))


def build(hf_config, quant_config, dtype=torch.bfloat16):
    """The model on the meta device: layers and methods, no memory."""
    kwargs = {"quant_config": quant_config} if quant_config is not None else {}
    with torch.device("meta"):
        return get_model_class(hf_config)(hf_config, dtype=dtype, attn_backend=ReferenceAttentionBackend, **kwargs)


def fp8_config(hf_config) -> QuantizationConfig:
    from brigade.plugins import load_plugins

    load_plugins("engine")
    return get_quant_config(ModelConfig(model="unused", quantization="fp8"), hf_config)


def test_unquantized_model_says_none_and_its_dtype(hf_config):
    line = quantization_summary(build(hf_config, None), None)
    assert line == "quantization: none; qkv_proj, o_proj, gate_up_proj, down_proj, embeddings and lm_head in bfloat16"


def test_fp8_names_every_linear_family_and_what_stays_in_the_model_dtype(hf_config):
    config = fp8_config(hf_config)
    line = quantization_summary(build(hf_config, config), config)
    assert line == f"quantization: fp8 for {FAMILIES}; embeddings and lm_head in bfloat16"


def test_a_family_held_only_in_part_shows_the_count(hf_config):
    fp8 = fp8_config(hf_config)

    class FirstLayerOnly(QuantizationConfig):
        name = "fp8"

        @classmethod
        def from_hf_config(cls, hf_config):
            return cls()

        def get_linear_method(self, prefix):
            return fp8.get_linear_method(prefix) if ".layers.0." in prefix else None

    config = FirstLayerOnly()
    line = quantization_summary(build(hf_config, config), config)
    assert line.startswith("quantization: fp8 for qkv_proj (1 of 2), o_proj (1 of 2), gate_up_proj (1 of 2) and "
                           "down_proj (1 of 2); qkv_proj (1 of 2), ")
    assert line.endswith("down_proj (1 of 2), embeddings and lm_head in bfloat16")


def test_load_model_logs_it(hf_config, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="brigade.model_executor.loader"):
        load_model(ModelConfig(model=str(tmp_path), load_format="dummy"), hf_config, dtype=torch.float32,
                   device=torch.device("cpu"), attn_backend=ReferenceAttentionBackend)
    assert "quantization: none; qkv_proj, o_proj, gate_up_proj, down_proj, embeddings and lm_head in float32" \
        in caplog.messages
