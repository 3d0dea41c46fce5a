"""What one token reads and computes in a model, from its ``config.json`` alone: the bounds of the FP8,
mixture-of-experts and attention-shape benchmarks (``suite_summary.py``).

For a dense Llama-family model (Llama, Mistral, Qwen2/3, Gemma 2 and 3: the same q, k, v, o and gate, up, down
projections) and the MoE ones Brigade serves (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss), per decoder layer: the
attention projections (q, k, v, o, with their biases where ``attention_bias`` is set), the MLP (dense: gate, up,
down; MoE: the router, ``num_experts_per_tok`` experts of three projections each, and a shared expert with its gate
where the config has one; gpt-oss's router and experts carry biases), and once the LM head, read in full each step
even when it is tied to the embedding table (Gemma's 256k-row table). The embedding table is otherwise left out (a
decode step reads one row of it) and so are the norms and gpt-oss's attention sinks (a few KB). Counts are
parameters; ``weight_bytes`` prices the projections at 1 byte (FP8) or 2 (bf16) and the LM head and router at 2
(they stay in the model dtype under ``--quantization fp8``).

``kv_bytes_read`` adds what a decode step reads of the KV cache: every cached token of a full-attention layer, at
most the window of a sliding-window one (``layer_windows``: Gemma 2 alternates, Gemma 3 and gpt-oss list
``layer_types``, Mistral's window covers every layer).

Checked against the models built on the meta device: the Llama-3.1-8B shape gives 7.50 G parameters per token
(``device_limits.py``: 15.01 GB of bf16 weights read by a batch-1 step, norms and one embedding row included).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TokenParams:
    """Parameters one token multiplies by, by kind: ``projections`` (attention and MLP or experts, the layers
    ``--quantization fp8`` quantizes), ``router`` (MoE gates, shared-expert gates), ``lm_head``."""

    projections: int
    router: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.projections + self.router + self.lm_head

    def weight_bytes(self, projection_bytes: float = 2.0) -> float:
        """Bytes of weights one decode token reads: projections at ``projection_bytes`` each (1 for FP8), the
        router and LM head in bf16."""
        return self.projections * projection_bytes + 2.0 * (self.router + self.lm_head)


def load_config(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def attention_dims(config: dict) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a config: ``num_key_value_heads`` defaults to the query heads and
    ``head_dim`` to ``hidden_size / heads``, as transformers' Llama config does."""
    heads = config["num_attention_heads"]
    return heads, config.get("num_key_value_heads", heads), config.get("head_dim") or config["hidden_size"] // heads


def token_params(config: dict) -> TokenParams:
    """The active parameters of one token (see the module docstring).

    Raises:
        KeyError: a config without the fields of a Llama-family or MoE model (hidden_size, num_hidden_layers, ...).
    """
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads, head_dim = attention_dims(config)
    attention = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
    if config.get("attention_bias"):
        attention += (heads + 2 * kv_heads) * head_dim + h
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts:
        inter = config.get("moe_intermediate_size") or config["intermediate_size"]
        expert = 3 * h * inter
        router = h * experts
        if config.get("model_type") == "gpt_oss":  # biases on the router, gate_up [2I] and down [H]
            expert += 2 * inter + h
            router += experts
        mlp = config["num_experts_per_tok"] * expert
        shared = config.get("shared_expert_intermediate_size") or 0
        if shared:
            mlp += 3 * h * shared
            router += h  # the shared expert's sigmoid gate
    else:
        mlp, router = 3 * h * config["intermediate_size"], 0
    return TokenParams(projections=layers * (attention + mlp), router=layers * router,
                       lm_head=config["vocab_size"] * h)


def kv_bytes_per_token(config: dict, cache_bytes: float = 2.0) -> float:
    """Bytes of paged KV cache one cached token holds over all layers (K and V), ``cache_bytes`` per element
    (2 for bf16, 1 for an fp8 cache): what a decode step reads per token of context."""
    _, kv_heads, head_dim = attention_dims(config)
    return config["num_hidden_layers"] * 2 * kv_heads * head_dim * cache_bytes


def layer_windows(config: dict) -> list[int | None]:
    """Each layer's attention window in tokens (None: full attention), as transformers' configs define them.

    ``layer_types`` when the config lists them (Gemma 3, gpt-oss); Gemma 2 without them alternates, sliding
    first; Gemma 3 without them slides except every ``sliding_window_pattern``-th layer; otherwise
    ``sliding_window`` covers every layer (Mistral v0.1) unless it is unset, 0 or ``use_sliding_window`` is false
    (Qwen2/3), as ``brigade.config.engine_config.sliding_window`` reads it.
    """
    layers, window = config["num_hidden_layers"], config.get("sliding_window")
    if not window or config.get("use_sliding_window", True) is False:
        return [None] * layers
    if config.get("layer_types"):
        return [window if kind == "sliding_attention" else None for kind in config["layer_types"]]
    if config.get("model_type") == "gemma2":
        return [window if (i + 1) % 2 else None for i in range(layers)]
    if config.get("model_type") in ("gemma3", "gemma3_text"):
        pattern = config.get("sliding_window_pattern", 6)
        return [window if (i + 1) % pattern else None for i in range(layers)]
    return [window] * layers


def kv_bytes_read(config: dict, context: float, cache_bytes: float = 2.0) -> float:
    """Bytes of KV cache one sequence's decode step reads at ``context`` cached tokens: each layer's K and V over
    ``min(context, window)`` tokens (``layer_windows``), ``cache_bytes`` per element."""
    _, kv_heads, head_dim = attention_dims(config)
    return sum(min(context, window or context) for window in layer_windows(config)) * 2 * kv_heads * head_dim \
        * cache_bytes


def decode_gemv_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """The dense weight shapes ``(N, K)`` a batch-1 decode step multiplies through brigade-cuda's one-row GEMV, by
    name: the merged qkv and the o projections, the dense MLP's merged gate/up and down (models without experts),
    an MoE layer's router (``gate``; its experts run in the fused MoE kernel) and the LM head."""
    h = config["hidden_size"]
    heads, kv_heads, head_dim = attention_dims(config)
    shapes = {"qkv_proj": ((heads + 2 * kv_heads) * head_dim, h), "o_proj": (h, heads * head_dim)}
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts:
        shapes["router"] = (experts, h)
    else:
        shapes["gate_up_proj"] = (2 * config["intermediate_size"], h)
        shapes["down_proj"] = (h, config["intermediate_size"])
    shapes["lm_head"] = (config["vocab_size"], h)
    return shapes
