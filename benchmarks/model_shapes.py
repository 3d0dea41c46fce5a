"""What one token reads and computes in a model, from its ``config.json`` alone: the bounds of the FP8 and
mixture-of-experts benchmarks (``suite_summary.py``).

For a dense Llama-family model (Llama, Mistral, Qwen2/3) and the MoE ones Brigade serves (Mixtral, Qwen2-MoE,
Qwen3-MoE), per decoder layer: the attention projections (q, k, v, o), the MLP (dense: gate, up, down; MoE: the
router, ``num_experts_per_tok`` experts of three projections each, and a shared expert with its gate where the config
has one), and once the LM head. The embedding table is left out (a decode step reads one row of it) and so are the
norms (a few KB). Counts are parameters; ``linear_bytes`` prices the projections at 1 byte (FP8) or 2 (bf16) and the
LM head and router at 2 (they stay in the model dtype under ``--quantization fp8``).

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
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts:
        inter = config.get("moe_intermediate_size") or config["intermediate_size"]
        mlp = config["num_experts_per_tok"] * 3 * h * inter
        router = h * experts
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
