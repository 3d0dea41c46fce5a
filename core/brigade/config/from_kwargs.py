"""config_from_kwargs: a BrigadeConfig from flat keyword arguments (the offline ``LLM`` class's engine arguments),
each routed to the sub-config that has a field of that name, with scalar types checked."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from brigade.config.cache import CacheConfig
from brigade.config.compilation import CompilationConfig
from brigade.config.engine_config import BrigadeConfig
from brigade.config.errors import ConfigError
from brigade.config.kv_transfer import KVTransferConfig
from brigade.config.lora import LoRAConfig
from brigade.config.model import ModelConfig
from brigade.config.parallel import ParallelConfig
from brigade.config.scheduler import SchedulerConfig
from brigade.config.speculative import SpeculativeConfig

_SUB_CONFIGS = {"model_config": ModelConfig, "cache_config": CacheConfig, "scheduler_config": SchedulerConfig,
                "parallel_config": ParallelConfig, "compilation_config": CompilationConfig}


_LORA_KWARGS = ("enable_lora", "max_loras", "max_cpu_loras", "max_lora_rank", "lora_modules")


_SCALAR_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,),
                                               "str": (str, os.PathLike)}


def _checked_value(name: str, annotation: Any, value: Any) -> Any:
    """``value`` for the field ``name`` annotated ``annotation`` (a string, as this module's annotations are),
    when the annotation is a plain scalar (``int``, ``float | None``...); a path-like for a ``str`` becomes its
    str. Other annotations are left to the config classes' own checks.

    Raises:
        TypeError: naming the argument, the type it takes and the value given (``LLM(m, max_model_len="abc")``).
    """
    parts = [p.strip() for p in str(annotation).split("|")]
    kinds = [p for p in parts if p != "None"]
    if not kinds or any(k not in _SCALAR_TYPES for k in kinds):
        return value
    if value is None and "None" in parts:
        return value
    ok = value is not None and any(isinstance(value, _SCALAR_TYPES[k]) for k in kinds)
    if isinstance(value, bool) and "bool" not in kinds:  # True is an int to Python, not a length
        ok = False
    if not ok:
        expected = " or ".join(kinds) + (" or None" if "None" in parts else "")
        raise TypeError(f"engine argument {name} must be {expected}, got {type(value).__name__} {value!r:.60}")
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _lora_config(lora: dict[str, Any]) -> LoRAConfig | None:
    """The LoRAConfig of ``enable_lora=True`` and its companions, or None. Raises ConfigError for lora_modules
    without enable_lora."""
    if lora.pop("enable_lora", False):
        lora["lora_modules"] = dict(lora.get("lora_modules") or {})
        return LoRAConfig(**lora)
    if lora.get("lora_modules"):
        raise ConfigError("lora_modules needs enable_lora=True")
    return None


def _compilation_fields(value: Any) -> dict[str, Any]:
    """CompilationConfig fields from what vLLM's ``LLM`` takes: a level, a dict or a CompilationConfig.

    Raises ConfigError for another type or a dict with unknown keys.
    """
    if isinstance(value, CompilationConfig):
        value = dataclasses.asdict(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        value = {"level": value}
    if not isinstance(value, dict):
        raise ConfigError(f"compilation_config must be a level (0-3), a dict or a CompilationConfig, "
                          f"got {type(value).__name__}")
    allowed = [f.name for f in dataclasses.fields(CompilationConfig)]
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ConfigError(f"compilation_config has unknown keys {unknown}; allowed: {', '.join(allowed)}")
    return value


def config_from_kwargs(model: str, **kwargs: Any) -> BrigadeConfig:
    """Build a BrigadeConfig from flat keyword arguments named like the sub-configs' fields.

    ``LLM(model, dtype="float32", block_size=16, max_num_seqs=8)`` routes each name to its sub-config;
    ``attention_backend``, ``kv_transfer_config`` and ``speculative_config`` (dicts) go to BrigadeConfig itself;
    ``compilation_config`` (a level, a dict or a CompilationConfig, as vLLM's ``LLM`` takes it) fills the
    CompilationConfig; ``kv_cache_dtype`` (vLLM's name) is ``cache_dtype``; ``enable_lora=True``
    (with ``max_loras``, ``max_cpu_loras``, ``max_lora_rank``, ``lora_modules`` as a ``{name: path}`` dict) builds
    a LoRAConfig.

    Raises:
        TypeError: for a name no sub-config has, or a value of the wrong type for a scalar field (an int, float,
            bool or str one; ``max_model_len="abc"``), naming the argument and the type it takes.
        ConfigError: for a bad value.
    """
    parts: dict[str, dict[str, Any]] = {name: {} for name in _SUB_CONFIGS}
    parts["model_config"]["model"] = model
    top: dict[str, Any] = {}
    lora_config = _lora_config({k: kwargs.pop(k) for k in _LORA_KWARGS if k in kwargs})
    if lora_config is not None:
        top["lora_config"] = lora_config
    for key, value in kwargs.items():
        if key == "kv_cache_dtype":  # vLLM's name for it
            key = "cache_dtype"
        if key in ("attention_backend",):
            top[key] = value
            continue
        if key == "speculative_config":
            top[key] = None if value is None else SpeculativeConfig.from_dict(value)
            continue
        if key == "compilation_config":
            parts["compilation_config"].update(_compilation_fields(value))
            continue
        if key == "kv_transfer_config":
            top[key] = value if value is None or isinstance(value, KVTransferConfig) else KVTransferConfig(**value)
            continue
        for part, cls in _SUB_CONFIGS.items():
            fields = {f.name: f for f in dataclasses.fields(cls)}
            if key in fields:
                parts[part][key] = _checked_value(key, fields[key].type, value)
                break
        else:
            known = sorted([f.name for cls in _SUB_CONFIGS.values() for f in dataclasses.fields(cls)]
                           + list(_LORA_KWARGS) + ["attention_backend", "compilation_config", "kv_transfer_config",
                                                   "speculative_config"])
            raise TypeError(f"unknown engine argument {key!r}; known: {', '.join(known)}")
    config = BrigadeConfig(**{part: cls(**parts[part]) for part, cls in _SUB_CONFIGS.items()}, **top)
    if config.lora_config is not None:
        config.lora_config.check_names(config.model_config.served_model_names)
    return config
