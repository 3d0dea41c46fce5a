"""A config that asks for sliding-window attention: Brigade attends to the full context, which is the model's
attention only within the window, so max_model_len stays within it (vLLM's ``--disable-sliding-window``)."""

from __future__ import annotations

import logging

import pytest
import transformers

from brigade.config import BrigadeConfig, ConfigError, ModelConfig


def mistral(**overrides) -> transformers.MistralConfig:
    return transformers.MistralConfig(**{"max_position_embeddings": 32768, "sliding_window": 4096, **overrides})


def test_the_default_length_is_capped_to_the_window_with_one_log_line(caplog):
    config = BrigadeConfig(ModelConfig(model="m"))
    with caplog.at_level(logging.WARNING):
        config.resolve(mistral())
    assert config.model_config.max_model_len == 4096
    assert [r.getMessage() for r in caplog.records] == [
        "the model asks for sliding-window attention (window 4096), which Brigade does not have: max_model_len is "
        "capped to the window (it would be 32768)"]


def test_a_longer_max_model_len_is_one_line():
    config = BrigadeConfig(ModelConfig(model="m", max_model_len=8192))
    with pytest.raises(ConfigError, match=r"^--max-model-len 8192 exceeds the model's sliding window \(4096\): .*"
                                          r"use at most 4096$"):
        config.resolve(mistral())


@pytest.mark.parametrize("hf_config", [mistral(sliding_window=None),
                                       transformers.Qwen2Config(max_position_embeddings=32768, sliding_window=4096,
                                                                use_sliding_window=False),
                                       mistral(sliding_window=0)],
                         ids=["no-window", "window-switched-off", "window-0"])
def test_full_attention_configs_keep_their_length(hf_config):
    config = BrigadeConfig(ModelConfig(model="m", max_model_len=32768))
    config.resolve(hf_config)
    assert config.model_config.max_model_len == 32768
    within = BrigadeConfig(ModelConfig(model="m", max_model_len=2048))
    within.resolve(mistral())  # within the window: full attention is the model's
    assert within.model_config.max_model_len == 2048
