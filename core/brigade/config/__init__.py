"""Configuration: small dataclasses, one per component and one module each, composed into BrigadeConfig.

``from brigade.config import X`` works for every public name; ``config_from_kwargs`` builds one from the flat
engine arguments of the offline ``LLM`` class.
"""

from brigade.config.cache import MIN_KV_BLOCKS, CacheConfig
from brigade.config.compilation import CUDAGRAPH_MODES, CompilationConfig
from brigade.config.engine_config import BrigadeConfig
from brigade.config.errors import ConfigError
from brigade.config.from_kwargs import config_from_kwargs
from brigade.config.kv_transfer import KVTransferConfig
from brigade.config.lora import POSSIBLE_MAX_LORA_RANKS, LoRAConfig
from brigade.config.model import ModelConfig
from brigade.config.parallel import ParallelConfig
from brigade.config.scheduler import SchedulerConfig
from brigade.config.speculative import (MAX_SPECULATIVE_TOKENS, SPECULATIVE_KEYS, SPECULATIVE_METHODS,
                                        SpeculativeConfig)

__all__ = ["CUDAGRAPH_MODES", "MAX_SPECULATIVE_TOKENS", "MIN_KV_BLOCKS", "POSSIBLE_MAX_LORA_RANKS",
           "SPECULATIVE_KEYS", "SPECULATIVE_METHODS", "BrigadeConfig", "CacheConfig", "CompilationConfig",
           "ConfigError", "KVTransferConfig", "LoRAConfig", "ModelConfig", "ParallelConfig", "SchedulerConfig",
           "SpeculativeConfig", "config_from_kwargs"]
