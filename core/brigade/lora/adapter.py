"""Loading and checking PEFT LoRA adapters (Hu et al. 2021, arXiv:2106.09685).

An adapter folder holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules`` as a list of
projection names, or as PEFT's string: "all-linear" or a regex matched against ``model.layers.{i}.{block}.
{proj}``; optional ``use_rslora``) and ``adapter_model.safetensors`` with tensors named
``base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_A.weight`` ([r, in]) and ``...lora_B.weight``
([out, r]). The adapted projection computes ``W x + scaling * B (A x)`` with ``scaling = lora_alpha / r``
(``lora_alpha / sqrt(r)`` with rsLoRA). Everything this module cannot serve is refused with one
``LoRAError`` line naming the adapter and the reason, never silently skipped.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from brigade.config import ConfigError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# HF projection names an adapter may target, with the block that holds each.
SUPPORTED_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                     "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_TENSOR_NAME = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# adapter_config.json options that change the math in ways this module does not implement, when set.
_UNSUPPORTED_OPTIONS = ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern", "layer_replication")


class LoRAError(ConfigError):
    """An adapter Brigade cannot serve; the message names the adapter and the reason, in one line."""


class LoRANameError(LoRAError):
    """A name a new adapter cannot take: empty, the served model's, or already served (or being loaded)."""


class UnknownLoRAError(LoRAError):
    """An adapter name that is not loaded (unloading it, or running on it); the server answers 404."""


def target_shapes(hf_config: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every projection an adapter may target, for a Llama-family config."""
    hidden = hf_config.hidden_size
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    inter = hf_config.intermediate_size
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


PEFT_DEFAULT_LORA_ALPHA = 8  # peft.LoraConfig's default, for an adapter_config.json that leaves lora_alpha out


@dataclass
class LoRAAdapter:
    """One adapter's weights on the host, checked against the model.

    Attributes:
        name, path: as registered.
        rank: ``r`` of adapter_config.json (every tensor pair has it).
        scaling: ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA); a config without ``lora_alpha`` has PEFT's
            default, 8 (what PEFT itself would load it with).
        weights: ``(layer index, HF projection name) -> (A [r, in], B [out, r])``, float32 on the CPU,
            unscaled. Projections absent from the dict are not adapted.
    """

    name: str
    path: str
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def target_modules(self) -> set[str]:
        return {module for _, module in self.weights}


def _read_config(name: str, path: str) -> dict[str, Any]:
    def fail(reason: str) -> LoRAError:
        return LoRAError(f"LoRA adapter {name!r} ({path}): {reason}")

    if not os.path.isdir(path):
        raise fail("not a folder; give a PEFT adapter folder holding adapter_config.json and "
                   "adapter_model.safetensors")
    for needed in (CONFIG_FILE, WEIGHTS_FILE):
        if not os.path.isfile(os.path.join(path, needed)):
            extra = " (adapter_model.bin is not read; re-save with safetensors)" \
                if needed == WEIGHTS_FILE and os.path.isfile(os.path.join(path, "adapter_model.bin")) else ""
            raise fail(f"no {needed} in the folder{extra}")
    try:
        with open(os.path.join(path, CONFIG_FILE), encoding="utf-8-sig") as f:
            cfg = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, huge ints
        raise fail(f"cannot read {CONFIG_FILE}: {_short(exc)}") from None
    if not isinstance(cfg, dict):
        raise fail(f"{CONFIG_FILE} is not a JSON object")
    return cfg


def _short(value: object, limit: int = 200) -> str:
    """An exception's message or a config value, cut to ``limit`` characters (a hostile file can make it megabytes
    long; runtime loading echoes no config value longer than that)."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def load_adapter(name: str, path: str, hf_config: Any, *, max_rank: int) -> LoRAAdapter:
    """Read and check a PEFT adapter for a model with ``hf_config``; see ``_load_adapter``.

    Raises:
        LoRAError: for every problem of the folder, its config or its tensors, whatever the cause: an adapter
            that fails in an unforeseen way is refused in one line, never a crash of the engine that loads it.
    """
    try:
        return _load_adapter(name, path, hf_config, max_rank=max_rank)
    except LoRAError:
        raise
    except Exception as exc:  # noqa: BLE001 - files from a client (runtime loading): refuse, never crash
        raise LoRAError(f"LoRA adapter {name!r} ({path}): cannot be loaded: {type(exc).__name__}: "
                        f"{_short(exc)}") from None


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _load_adapter(name: str, path: str, hf_config: Any, *, max_rank: int) -> LoRAAdapter:
    """Read and check a PEFT adapter for a model with ``hf_config``.

    Args:
        name: the adapter's name (for messages and as ``LoRAAdapter.name``).
        path: the adapter folder.
        hf_config: the base model's config (layer count and projection shapes).
        max_rank: ``--max-lora-rank``.
    Returns:
        The adapter, weights in float32 on the CPU.
    Raises:
        LoRAError: missing files, unreadable config or tensors, unsupported options (``bias`` other than
            "none", ``modules_to_save``, DoRA, per-module rank or alpha patterns), rank above ``max_rank``,
            a target module the model lacks, a tensor of the wrong shape, an A without its B, a NaN or
            infinite value in a tensor or in ``lora_alpha`` (one bad adapter would otherwise make NaN logits).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    def fail(reason: str) -> LoRAError:
        return LoRAError(f"LoRA adapter {name!r} ({path}): {reason}")

    cfg = _read_config(name, path)
    rank, alpha = _rank_and_alpha(cfg, max_rank, fail)
    shapes = target_shapes(hf_config)
    targets, pattern = _target_modules(cfg, shapes, fail)
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    try:
        tensors = load_file(os.path.join(path, WEIGHTS_FILE), device="cpu")
    except (OSError, SafetensorError) as exc:
        raise fail(f"cannot read {WEIGHTS_FILE}: {_short(exc)}") from None
    checker = _TensorChecker(rank=rank, num_layers=hf_config.num_hidden_layers, shapes=shapes, targets=targets,
                             pattern=pattern, fail=fail)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        layer, module, half = checker(key, tensor)
        halves.setdefault((layer, module), {})[half] = tensor.to(torch.float32)
    if not halves:
        raise fail(f"{WEIGHTS_FILE} holds no LoRA weights")
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise fail(f"layer {layer} {module} has no {missing} weight")
        weights[layer, module] = (pair["A"], pair["B"])
    return LoRAAdapter(name=name, path=path, rank=rank, scaling=float(scaling), weights=weights)


def _rank_and_alpha(cfg: dict[str, Any], max_rank: int, fail: Callable[[str], LoRAError]) -> tuple[int, float]:
    """``r`` and ``lora_alpha`` of adapter_config.json, checked, after refusing what this module cannot serve
    (a peft_type other than LORA, biases, ``_UNSUPPORTED_OPTIONS``)."""
    peft_type = cfg.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise fail(f"adapter_config.json peft_type is {_short(repr(peft_type), 60)}; only LORA adapters are served")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha", PEFT_DEFAULT_LORA_ALPHA)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 1 << 20:
        raise fail(f"adapter_config.json 'r' must be a positive integer, got {_short(repr(rank), 60)}")
    if (not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or abs(alpha) > 1e30
            or not math.isfinite(alpha)):
        raise fail(f"adapter_config.json 'lora_alpha' must be a finite number, got {_short(repr(alpha), 60)}")
    if rank > max_rank:
        raise fail(f"rank {rank} is above --max-lora-rank {max_rank}; raise --max-lora-rank to at least {rank}")
    bias = cfg.get("bias", "none")
    if bias not in (None, "none"):
        raise fail(f"bias {_short(repr(bias))} is not supported (only 'none': the adapter must not train biases)")
    for option in _UNSUPPORTED_OPTIONS:
        if cfg.get(option):
            raise fail(f"{option} is not supported (got {_short(repr(cfg[option]))})")
    return rank, alpha


def _target_modules(cfg: dict[str, Any], shapes: dict[str, tuple[int, int]],
                    fail: Callable[[str], LoRAError]) -> tuple[list[str] | None, re.Pattern | None]:
    """adapter_config.json's ``target_modules`` as (a list of projection names, or None for any) and (a regex
    the module's full name must match, or None). PEFT: a string is "all-linear" or such a regex."""
    targets = cfg.get("target_modules")
    if not (targets is None or isinstance(targets, str)
            or (isinstance(targets, list) and all(isinstance(t, str) for t in targets))):
        raise fail("adapter_config.json 'target_modules' must be a list of module names or a string (\"all-linear\" "
                   f"or a regular expression), got {_short(repr(targets), 60)}")
    pattern = None
    if isinstance(targets, str):
        if targets not in shapes:
            try:
                pattern = None if targets == "all-linear" else re.compile(targets)
            except re.error as exc:
                raise fail(f"target_modules {_short(repr(targets))} is not a valid regular expression: "
                           f"{_short(exc)}") from None
            targets = None
        else:
            targets = [targets]
    for module in targets or []:
        if module not in shapes:
            raise fail(f"target module {_short(repr(module))} is not a projection of this model that LoRA can adapt "
                       f"(supported: {', '.join(shapes)})")
    return targets, pattern


@dataclass
class _TensorChecker:
    """Checks one tensor of adapter_model.safetensors against the config and the model."""

    rank: int
    num_layers: int
    shapes: dict[str, tuple[int, int]]  # projection -> (in_features, out_features)
    targets: list[str] | None
    pattern: re.Pattern | None
    fail: Callable[[str], LoRAError]

    def __call__(self, key: str, tensor: torch.Tensor) -> tuple[int, str, str]:
        """(layer, projection, "A" or "B") of a valid tensor.

        Raises:
            LoRAError: a name that is no lora_A/lora_B weight of an adaptable projection, a layer the model
                lacks, a module outside ``target_modules``, a non-float dtype, NaN or infinite values, a shape
                other than [r, in] (A) or [out, r] (B).
        """
        fail, shapes = self.fail, self.shapes
        match = _TENSOR_NAME.match(key)
        if match is None or SUPPORTED_MODULES.get(match.group(3)) != match.group(2):
            raise fail(f"tensor {key!r} is not a lora_A/lora_B weight of a projection LoRA can adapt here "
                       f"({', '.join(shapes)})")
        layer, module, half = int(match.group(1)), match.group(3), match.group(4)
        if layer >= self.num_layers:
            raise fail(f"tensor {key!r} is for layer {layer}, but the model has {self.num_layers} layers")
        if self.targets is not None and module not in self.targets:
            raise fail(f"tensor {key!r} adapts {module}, which is not in target_modules {_short(repr(self.targets))}")
        if self.pattern is not None and not self.pattern.fullmatch(f"model.layers.{layer}.{match.group(2)}.{module}"):
            raise fail(f"tensor {key!r} adapts a module that target_modules {_short(repr(self.pattern.pattern))} "
                       "does not match")
        if tensor.dtype not in FLOAT_DTYPES:
            raise fail(f"tensor {key!r} is {tensor.dtype}; LoRA weights must be float32, float16 or bfloat16")
        if not torch.isfinite(tensor).all():
            raise fail(f"tensor {key!r} holds NaN or infinite values")
        in_f, out_f = shapes[module]
        expected = (self.rank, in_f) if half == "A" else (out_f, self.rank)
        if tuple(tensor.shape) != expected:
            raise fail(f"tensor {key!r} has shape {list(tensor.shape)}, expected {list(expected)} "
                       f"(rank {self.rank}, {module} maps {in_f} -> {out_f})")
        return layer, module, half


def check_adapters(lora_config: Any, hf_config: Any) -> None:
    """Load every ``--lora-modules`` adapter of ``lora_config`` (a LoRAConfig) once, to refuse a bad one at
    start-up in one line (the workers load them again).

    Raises:
        LoRAError: the first adapter that cannot be served.
    """
    for name, path in lora_config.lora_modules.items():
        load_adapter(name, path, hf_config, max_rank=lora_config.max_lora_rank)
