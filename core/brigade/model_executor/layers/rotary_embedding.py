"""Rotary position embedding (Su et al. 2021, "RoFormer"), with Llama 3.1's and YaRN's frequency scaling,
linear position interpolation and Phi-3's LongRoPE.

The cos/sin table is built once for every position up to ``max_position`` and indexed by each token's
absolute position, so the model never needs to know how a batch is laid out.

A ``CustomOp``: ``forward_native`` is the reference; a platform may register a fused kernel through
the ``register_kernels`` hook (op ``"rotary_embedding"``, see ``custom_op``). A kernel reads
``layer.cos_sin_cache`` ([max_position, rotary_dim] fp32, cos in the first half of the last dimension,
sin in the second, both already multiplied by YaRN's attention factor), ``layer.head_size``,
``layer.rotary_dim`` and ``layer.is_neox_style``, and may rotate ``query`` and ``key`` in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from brigade.model_executor.layers.custom_op import CustomOp

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# Older names of the types above, as configs on the hub still spell them (transformers renames them the same way).
_ROPE_TYPE_ALIASES = {"su": "longrope"}
# The layer types of configs whose rope_parameters hold one dict per type (transformers 5's Gemma 3).
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True, slots=True)
class RopeParameters:
    """The RoPE settings of one model, normalized across transformers 4 and 5 config layouts."""

    rope_theta: float  # base of the geometric frequency ladder
    rope_type: str = "default"  # one of SUPPORTED_ROPE_TYPES
    partial_rotary_factor: float = 1.0  # fraction of head_size that is rotated
    scaling: dict[str, Any] = field(default_factory=dict)  # type-specific keys (factor, ...)
    attention_factor: float = 1.0  # multiplies cos and sin (LongRoPE's attention scaling), so q.k by its square


def get_rope_parameters(hf_config: Any, layer_type: str | None = None) -> RopeParameters:
    """Read RoPE settings from an HF config, for the layers of ``layer_type`` when they differ by type.

    transformers 5 keeps everything in ``rope_parameters`` (including ``rope_theta``), one dict per layer type
    (``"full_attention"``, ``"sliding_attention"``) for Gemma 3; transformers 4 has a top-level ``rope_theta`` and an
    optional ``rope_scaling`` dict whose type key is ``rope_type`` or, in older files, ``type`` (Gemma 3's local
    layers there use ``rope_local_base_freq`` and no scaling). LongRoPE also reads
    ``original_max_position_embeddings`` and ``max_position_embeddings``: their ratio sets its attention factor
    ``sqrt(1 + ln(factor) / ln(original))`` unless the config gives ``attention_factor`` (transformers'
    ``_compute_longrope_parameters``).

    Raises:
        ValueError: the rope type is not one Brigade implements, or LongRoPE lacks its factors.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if any(key in params for key in LAYER_TYPES):  # one dict per layer type
        params = dict(params.get(layer_type or "full_attention") or {})
    elif layer_type == "sliding_attention" and getattr(hf_config, "rope_local_base_freq", None) is not None:
        params = {"rope_type": "default", "rope_theta": hf_config.rope_local_base_freq}
    legacy_scaling = getattr(hf_config, "rope_scaling", None)
    if isinstance(legacy_scaling, dict) and layer_type != "sliding_attention":
        params = {**legacy_scaling, **params}
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        theta = 10000.0  # the RoFormer/Llama default when a config states nothing
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    rope_type = _ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    params.pop("type", None)
    partial = params.pop("partial_rotary_factor", None)
    if partial is None:
        partial = getattr(hf_config, "partial_rotary_factor", 1.0)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported; Brigade implements "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    attention_factor = 1.0
    if rope_type == "longrope":
        attention_factor = _longrope_attention_factor(hf_config, params)
    return RopeParameters(rope_theta=float(theta), rope_type=rope_type, partial_rotary_factor=float(partial),
                          scaling=params, attention_factor=attention_factor)


def _longrope_attention_factor(hf_config: Any, params: dict[str, Any]) -> float:
    """Check LongRoPE's keys (``params`` gains ``original_max_position_embeddings``) and return its factor."""
    for key in ("short_factor", "long_factor"):
        if not isinstance(params.get(key), (list, tuple)):
            raise ValueError(f"longrope rope scaling needs a {key!r} list in rope_parameters")
    original = params.get("original_max_position_embeddings") or getattr(
        hf_config, "original_max_position_embeddings", None)
    if not original:
        raise ValueError("longrope rope scaling needs original_max_position_embeddings")
    params["original_max_position_embeddings"] = int(original)
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = params.get("factor") or hf_config.max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def compute_inv_freq(rotary_dim: int, rope: RopeParameters, max_position: int | None = None, *,
                     max_len: int | None = None) -> torch.Tensor:
    """Inverse frequencies ``theta ** (-2i / rotary_dim)``, rescaled for the rope type.

    Args: ``max_len``: the longest sequence served (LongRoPE's choice of factors; None: short factors).
    Returns: [rotary_dim // 2] fp32 on the default device.

    "linear" divides every frequency by ``factor`` (position interpolation, Chen et al. 2023).
    "llama3" follows Meta's Llama 3.1 reference ``apply_scaling``: wavelengths shorter than
    ``original_max_position_embeddings / high_freq_factor`` are kept, longer than
    ``... / low_freq_factor`` are divided by ``factor``, and those in between are blended linearly.
    "yarn": ``yarn_parameters`` (``max_position``: the model's ``max_position_embeddings``, which sets the factor
    of a config without one).
    "longrope" (Phi-3, Ding et al. 2024, "LongRoPE") divides frequency ``i`` by ``long_factor[i]`` when
    ``max_len`` exceeds ``original_max_position_embeddings``, else by ``short_factor[i]``.
    """
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (rope.rope_theta ** exponents)
    if rope.rope_type == "linear":
        return inv_freq / float(rope.scaling["factor"])
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, rope.scaling)
    if rope.rope_type == "yarn":
        return yarn_parameters(rotary_dim, rope, max_position)[0]
    if rope.rope_type == "longrope":
        long = max_len is not None and max_len > rope.scaling["original_max_position_embeddings"]
        factors = torch.tensor(rope.scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"longrope needs {inv_freq.numel()} factors (rotary_dim / 2), got {factors.numel()}")
        return inv_freq / factors
    return inv_freq


def attention_factor(rotary_dim: int, rope: RopeParameters, max_position: int | None = None) -> float:
    """The factor on cos and sin: YaRN's ``mscale``, LongRoPE's ``attention_factor``, 1.0 for the other types."""
    if rope.rope_type == "yarn":
        return yarn_parameters(rotary_dim, rope, max_position)[1]
    return rope.attention_factor


def yarn_parameters(rotary_dim: int, rope: RopeParameters, max_position: int | None) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023, arXiv:2309.00071): inverse frequencies and the attention factor, as transformers'
    ``_compute_yarn_parameters`` computes them.

    Frequencies rotating fewer than ``beta_slow`` times over ``original_max_position_embeddings`` are divided by
    ``factor`` (interpolation), those rotating more than ``beta_fast`` times are kept (extrapolation), and a linear
    ramp over the dimensions in between blends the two; ``truncate`` (default true) rounds the ramp's bounds out to
    whole dimensions. The attention factor is ``attention_factor`` when given, else ``0.1 * ln(factor) + 1`` (or
    DeepSeek's ratio of two such terms with ``mscale`` and ``mscale_all_dim``). A config without ``factor`` takes
    ``max_position / original_max_position_embeddings``; without the original length, ``max_position``.

    Returns: ([rotary_dim // 2] fp32, attention factor).

    Raises:
        ValueError: no factor and no ``max_position`` to derive it from.
    """
    scaling, base, dim = rope.scaling, rope.rope_theta, rotary_dim
    original = scaling.get("original_max_position_embeddings") or max_position
    factor = scaling.get("factor")
    if factor is None:
        if max_position is None or original is None:
            raise ValueError("yarn rope scaling needs 'factor' (or max_position_embeddings and "
                             "original_max_position_embeddings) in rope_parameters")
        factor = max_position / original
    factor = float(factor)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    mscale_factor = scaling.get("attention_factor")
    if mscale_factor is None:
        if mscale and mscale_all_dim:
            mscale_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            mscale_factor = _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:  # the dimension that rotates num_rotations times
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp  # weight of the unscaled frequency
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(mscale_factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _llama3_scale(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    try:
        factor = float(scaling["factor"])
        low_freq_factor = float(scaling["low_freq_factor"])
        high_freq_factor = float(scaling["high_freq_factor"])
        old_context_len = float(scaling["original_max_position_embeddings"])
    except KeyError as missing:
        raise ValueError(f"llama3 rope scaling needs {missing.args[0]!r} in rope_parameters") from None
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(CustomOp):
    """Rotates the first ``rotary_dim`` channels of every query and key head by ``position * inv_freq``.

    Invariant: ``cos_sin_cache[p]`` holds ``a * cos(p * inv_freq)`` then ``a * sin(p * inv_freq)`` for every
    position ``0 <= p < max_position``, ``a`` the rope's ``attention_factor`` (1 but for LongRoPE). Neox style
    (Llama, Mistral, Qwen2) pairs channel ``i`` with ``i + rotary_dim / 2``; GPT-J style pairs ``2i`` with ``2i + 1``.

    LongRoPE picks its long or short factors once, from ``max_model_len`` (the longest sequence the engine serves)
    against ``original_max_position_embeddings``, as vLLM does: every token of every request is rotated the same way
    whatever the batch or the chunking, so prefix-cache hits stay exact. transformers decides per forward call
    (long once the call's last position passes the original length), which gives the same rotation when the
    sequences served all stay within the original length, or all start past it.
    """

    op_name = "rotary_embedding"

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, rope: RopeParameters, *,
                 is_neox_style: bool = True, max_model_len: int | None = None):
        """``max_model_len``: the longest sequence served (LongRoPE's choice; None: ``max_position``)."""
        super().__init__()
        if rotary_dim % 2 or rotary_dim > head_size:
            raise ValueError(f"rotary_dim must be even and at most head_size {head_size}, got {rotary_dim}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.is_neox_style = is_neox_style
        self.rope = rope
        inv_freq = compute_inv_freq(rotary_dim, rope, max_position, max_len=max_model_len or max_position)
        scale = attention_factor(rotary_dim, rope, max_position)  # YaRN's or LongRoPE's; 1 otherwise
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_position, rotary_dim // 2]
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        if scale != 1.0:
            cos_sin = cos_sin * scale
        # fp32 even for bf16 models: angles at large positions need the mantissa.
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply the rotation at each token's position.

        Args:
            positions: [num_tokens] int64 absolute positions (< max_position).
            query: [num_tokens, num_heads * head_size] (or [num_tokens, num_heads, head_size]).
            key: [num_tokens, num_kv_heads * head_size] (or 3-D likewise).

        Returns:
            (query, key) with the input shapes and dtypes; computed in fp32.
        """
        cos_sin = self.cos_sin_cache.index_select(0, positions)  # [T, rotary_dim]
        cos, sin = cos_sin.chunk(2, dim=-1)  # [T, rotary_dim // 2] each
        cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x = x.reshape(shape[0], -1, self.head_size).float()  # [T, heads, head_size]
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
        if self.is_neox_style:
            rot = torch.cat([out1, out2], dim=-1)
        else:
            rot = torch.stack([out1, out2], dim=-1).flatten(-2)
        return torch.cat([rot, rest], dim=-1).to(dtype).reshape(shape)

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, max_position={self.max_position}, "
                f"theta={self.rope.rope_theta}, type={self.rope.rope_type}, impl={self.impl_name}")
