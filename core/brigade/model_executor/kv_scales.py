"""Per-layer k/v scales of the fp8 KV cache, read from the checkpoint (``brigade.attention.fp8_kv``).

Checkpoints name them as vLLM reads them: ``model.layers.{i}.self_attn.k_scale`` / ``v_scale`` (what
llm-compressor's ``kv_cache_scheme`` and the ``quant_method: fp8`` exporters write today), or, in older
compressed-tensors checkpoints, ``model.layers.{i}.self_attn.k_proj.output_scale`` / ``v_proj.output_scale``
(vLLM's ``maybe_remap_kv_scale_name`` maps both). Each is one float per layer (a tensor of one element) and
goes to the layer's attention backend (``AttentionBackend.k_scale``/``v_scale``), fixed from then on. The
scales are read whatever the cache dtype, and used only by a float8 cache.

Checkpoints quantized for FP8 attention also carry ``self_attn.q_scale`` (or ``q_proj.output_scale``) and
``self_attn.prob_scale`` (the query and the softmax output in e4m3, in vLLM's FP8 attention). Brigade's attention
keeps queries and probabilities in the model dtype: those tensors are checked like the k/v scales, then left
unused, and the start-up log says so once.
"""

from __future__ import annotations

import logging
import math
import re

import torch
from torch import nn

from brigade.model_executor.layers.attention import Attention
from brigade.model_executor.weight_utils import CheckpointTensor, materialize

logger = logging.getLogger(__name__)

_KV_SCALE_NAME = re.compile(r"^(?P<attn>.+\.self_attn)\."
                            r"(?:(?P<kv>[kvq]|prob)_scale|(?P<proj>[kvq])_proj\.output_scale)$")


def kv_scale_target(hf_name: str) -> tuple[str, str] | None:
    """``(attention module name, "k", "v", "q" or "prob")`` when ``hf_name`` is an attention scale, else None.

    >>> kv_scale_target("model.layers.3.self_attn.k_proj.output_scale")
    ('model.layers.3.self_attn', 'k')
    """
    match = _KV_SCALE_NAME.match(hf_name)
    if match is None:
        return None
    return match.group("attn"), match.group("kv") or match.group("proj")


def scale_value(hf_name: str, tensor: torch.Tensor | CheckpointTensor) -> float:
    """The checkpoint tensor ``hf_name`` as one positive finite float.

    Raises:
        ValueError: one line naming the tensor, when it has more than one element or is NaN, infinite, zero
            or negative.
    """
    tensor = materialize(tensor)  # a lazy handle under tensor parallelism: every rank reads the one float
    if tensor.numel() != 1:
        raise ValueError(f"KV-cache scale {hf_name!r} has shape {list(tensor.shape)}; Brigade reads one scale per "
                         "layer (a tensor of one element), as vLLM's per-tensor fp8 KV cache does")
    value = float(tensor.reshape(()).float())
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"KV-cache scale {hf_name!r} is {value}; a scale must be a positive finite number "
                         "(stored = x / scale): fix or drop it from the checkpoint (1.0 is used without one)")
    return value


def load_kv_scale(model: nn.Module, attn_name: str, which: str, hf_name: str,
                  tensor: torch.Tensor | CheckpointTensor) -> None:
    """Give the ``Attention`` under module ``attn_name`` (e.g. ``model.layers.3.self_attn``) its k or v scale
    (a q or prob scale is checked, counted and not used).

    Raises:
        ValueError: a bad scale (``scale_value``), or no attention layer under that name.
    """
    value = scale_value(hf_name, tensor)
    try:
        attn = model.get_submodule(attn_name).attn
    except AttributeError:
        attn = None
    if not isinstance(attn, Attention):
        raise ValueError(f"KV-cache scale {hf_name!r} names no attention layer of {type(model).__name__}")
    if which in ("q", "prob"):
        attn.unused_scales += 1
        return
    attn.set_kv_scale(which, value)


def log_kv_scales(model: nn.Module) -> None:
    """Say in one INFO line where the fp8 KV cache's scales come from (call it once the weights are loaded)."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    unused = sum(m.unused_scales for m in layers)
    if unused:
        logger.info("the checkpoint's %d q_scale/prob_scale tensor(s) are not used: attention keeps queries and "
                    "probabilities in the model dtype (only the KV cache is fp8)", unused)
    given = [m for m in layers if m.kv_scales_loaded]
    if not given:
        logger.info("fp8 KV cache: the checkpoint has no k_scale/v_scale tensors; every layer uses scale 1.0 "
                    "(K/V beyond +-448 saturate)")
        return
    k = [m.backend.k_scale for m in given]
    v = [m.backend.v_scale for m in given]
    others = "" if len(given) == len(layers) else f"; the other {len(layers) - len(given)} use 1.0"
    logger.info("fp8 KV cache: k_scale/v_scale of %d of %d layers from the checkpoint (k %.4g to %.4g, v %.4g to "
                "%.4g)%s", len(given), len(layers), min(k), max(k), min(v), max(v), others)


__all__ = ["kv_scale_target", "load_kv_scale", "log_kv_scales", "scale_value"]
