"""Tiny random-weight mixture-of-experts checkpoints for the tests (Mixtral, Qwen2-MoE with its shared expert,
Qwen3-MoE), built with transformers' own classes, and transformers' greedy tokens on them.

One place for the shapes the MoE tests share: the model tests (tests/model_executor), the engine and parallelism
tests (tests/engine, tests/distributed) and the GPU tests (tests/cuda) pick a family and override what they need.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import transformers

# What every tiny MoE model shares: GQA attention (4 query heads, 2 KV heads), an untied LM head.
BASE = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=None)
# Each family's experts: Mixtral 4 experts, top-2 renormalised; Qwen2-MoE 6 experts, top-2 raw, a shared expert;
# Qwen3-MoE 8 experts, top-3 renormalised, q/k norms.
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=80, moe_intermediate_size=24, shared_expert_intermediate_size=40,
                       num_experts=6, num_experts_per_tok=2)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(head_dim=32, intermediate_size=80, moe_intermediate_size=24, num_experts=8,
                       num_experts_per_tok=3, norm_topk_prob=True)),
}


def moe_config(family: str, **fields):
    """The transformers config of a tiny ``family`` model ("mixtral", "qwen2-moe", "qwen3-moe"): ``BASE``, the
    family's experts, then ``fields`` over both."""
    config_cls, arch, experts = FAMILIES[family]
    return getattr(transformers, config_cls)(**{**BASE, **experts, **fields}, architectures=[arch])


def num_experts(config) -> int:
    """Experts per sparse layer, whatever the family calls the field."""
    return getattr(config, "num_local_experts", None) or config.num_experts


def save_moe_checkpoint(config, path: Path, *, seed: int = 0, tokenizer_dir: Path | None = None):
    """Build ``config``'s model with transformers (seed ``seed``), save it as safetensors at ``path`` (with the
    tokenizer files of ``tokenizer_dir`` beside it when given); returns the model in eval mode, on the CPU."""
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).eval()
    model.save_pretrained(str(path))
    if tokenizer_dir is not None:
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tokenizer_dir) / file, Path(path) / file)
    return model


def greedy_reference(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens for each prompt, exactly ``max_new_tokens`` of them (no EOS stop), on the
    model's device."""
    outs = []
    device = next(model.parameters()).device
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids], device=device)
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[], pad_token_id=0)
            outs.append(out[0, len(ids):].tolist())
    return outs
