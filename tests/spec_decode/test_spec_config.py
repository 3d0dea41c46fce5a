"""SpeculativeConfig through the offline API (``LLM(model, speculative_config={...})``, config_from_kwargs)."""

from __future__ import annotations

import pytest

from brigade.config import ConfigError, SpeculativeConfig, config_from_kwargs


def test_kwargs_build_the_config():
    config = config_from_kwargs("m", speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                         "prompt_lookup_max": 4, "prompt_lookup_min": 1})
    assert config.speculative_config == SpeculativeConfig("ngram", 4, 4, 1)
    assert config_from_kwargs("m").speculative_config is None


@pytest.mark.parametrize("value,expected", [
    ({"method": "draft_model", "num_speculative_tokens": 2}, "method 'draft_model' is not supported; supported: ngram"),
    ({"method": "ngram"}, 'needs "num_speculative_tokens"'),
    ({"method": "ngram", "num_speculative_tokens": -1}, "num_speculative_tokens must be from 1 to 64, got -1"),
    ({"method": "ngram", "num_speculative_tokens": 1000}, "num_speculative_tokens must be from 1 to 64, got 1000"),
    ({"method": "ngram", "num_speculative_tokens": None}, "num_speculative_tokens must be a whole number, got None"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": None, "prompt_lookup_min": 2.5},
     "prompt_lookup_min must be a whole number, got 2.5"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
     "prompt_lookup_min 3 is above prompt_lookup_max 2"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": -3},
     "prompt_lookup_max must be at least 1, got -3"),
    ({"method": "eagle", "num_speculative_tokens": 4, "model": "some/eagle-head"},
     "method 'eagle' is not supported; supported: ngram"),
])
def test_bad_values(value, expected):
    with pytest.raises(ConfigError) as info:
        config_from_kwargs("m", speculative_config=value)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_vllm_older_model_spelling_of_ngram():
    """vLLM once spelled the method as {"model": "[ngram]"}; both spellings build the n-gram config."""
    for model in ("ngram", "[ngram]"):
        config = config_from_kwargs("m", speculative_config={"model": model, "num_speculative_tokens": 3})
        assert config.speculative_config.method == "ngram" and config.speculative_config.num_speculative_tokens == 3
