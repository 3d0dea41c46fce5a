"""The start-up log's one line saying which quantization method each layer family of a loaded model got."""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from brigade.model_executor.layers.linear_method import QuantizationConfig, UnquantizedLinearMethod
from brigade.model_executor.layers.vocab import LMHead, VocabEmbedding


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def quantization_summary(model: nn.Module, quant_config: QuantizationConfig | None) -> str:
    """One line naming, per layer family (a linear layer's last name: ``qkv_proj``, ``down_proj``), the method
    that holds it, then the layers left in the model's dtype, e.g. ``quantization: fp8 for qkv_proj, o_proj,
    gate_up_proj, down_proj; lm_head and embeddings in bfloat16``, or ``quantization: none; qkv_proj, o_proj,
    gate_up_proj, down_proj, lm_head and embeddings in float32``.

    A family only some of whose layers a method holds shows the count, ``down_proj (3 of 30)``. Linear layers
    are the modules with a ``quant_method``; an unquantized one is named by its weight's dtype.
    """
    methods: dict[str, Counter[str]] = {}  # family -> {method or dtype: layers}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        family = name.rsplit(".", 1)[-1]
        if isinstance(method, UnquantizedLinearMethod):
            label = _dtype_name(module.weight.dtype)
        else:
            label = quant_config.name if quant_config is not None else type(method).__name__
        methods.setdefault(family, Counter())[label] += 1
    by_label: dict[str, list[str]] = {}
    for family, counts in methods.items():
        total = sum(counts.values())
        for label, count in counts.items():
            by_label.setdefault(label, []).append(family if count == total else f"{family} ({count} of {total})")
    for module in model.modules():
        if isinstance(module, LMHead):
            family = "lm_head (tied to the embeddings)" if module.tied else "lm_head"
            by_label.setdefault(_dtype_name(module.weight.dtype), []).append(family)
        elif isinstance(module, VocabEmbedding):
            by_label.setdefault(_dtype_name(module.weight.dtype), []).append("embeddings")
    method = quant_config.name if quant_config is not None else None
    parts = [] if method is None else [f"{method} for {_join(by_label.pop(method, ['no layer']))}"]
    parts += [f"{_join(families)} in {label}" for label, families in by_label.items()]
    return "quantization: " + "; ".join(parts if method is not None else ["none", *parts])
