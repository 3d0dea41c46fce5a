"""Sampling defaults from a model's generation_config.json, as vLLM applies them to requests."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from brigade.config import ModelConfig

logger = logging.getLogger(__name__)

_GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def load_generation_defaults(model_config: ModelConfig) -> dict[str, Any]:
    """Sampling defaults from the model's generation_config.json, as vLLM applies them.

    ``generation_config`` is "auto" (the model directory), "none", or another directory. Only the keys
    that map onto SamplingParams are kept; a field the client sets always wins over them.
    """
    if model_config.generation_config == "none":
        return {}
    folder = model_config.model if model_config.generation_config == "auto" else model_config.generation_config
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    defaults = {k: raw[k] for k in _GENERATION_CONFIG_KEYS if raw.get(k) is not None}
    if defaults:
        logger.info("default sampling parameters from %s: %s", path, defaults)
    return defaults
