"""A config that asks for sliding-window attention keeps its whole length: the attention layers apply the window
(``Attention(sliding_window=...)``), so max_model_len is the model's max_position_embeddings as for any model."""

from __future__ import annotations

import logging

import pytest
import transformers

from brigade.config import BrigadeConfig, ModelConfig
from brigade.config.engine_config import sliding_window


def mistral(**overrides) -> transformers.MistralConfig:
    return transformers.MistralConfig(**{"max_position_embeddings": 32768, "sliding_window": 4096, **overrides})


def test_a_window_does_not_cap_the_length_and_logs_nothing(caplog):
    config = BrigadeConfig(ModelConfig(model="m"))
    with caplog.at_level(logging.WARNING):
        config.resolve(mistral())
    assert config.model_config.max_model_len == 32768
    assert caplog.records == []
    longer = BrigadeConfig(ModelConfig(model="m", max_model_len=8192))
    longer.resolve(mistral())  # past the window: served with the window
    assert longer.model_config.max_model_len == 8192


@pytest.mark.parametrize("hf_config,window", [
    (mistral(), 4096),
    (mistral(sliding_window=None), None),
    (transformers.Qwen2Config(max_position_embeddings=32768, sliding_window=4096, use_sliding_window=False), None),
    (mistral(sliding_window=0), None),
], ids=["window", "no-window", "window-switched-off", "window-0"])
def test_the_window_a_config_asks_for(hf_config, window):
    assert sliding_window(hf_config) == window
    config = BrigadeConfig(ModelConfig(model="m", max_model_len=32768))
    config.resolve(hf_config)
    assert config.model_config.max_model_len == 32768
