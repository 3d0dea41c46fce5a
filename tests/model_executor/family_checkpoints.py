"""Tiny random-weight checkpoints of the Gemma 2, Gemma 3 (text), Phi-3 and Mistral families, built with
transformers' own classes (hidden 64, windows of 16 to 32 tokens), and transformers' greedy tokens on them."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

# What every tiny model shares: GQA attention (4 query heads, 2 KV heads of 16), a small vocabulary.
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
            pad_token_id=None)
# Each family's features at small sizes: windows of 16-32 tokens, Gemma's soft-caps and layer patterns, Gemma 3's
# local/global ropes with linear scaling, Phi-3's LongRoPE (original length 64) with a partial rotary.
FAMILIES = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(num_hidden_layers=4, sliding_window=16, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                    final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(num_hidden_layers=4, sliding_window=24, query_pre_attn_scalar=16, sliding_window_pattern=3,
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(num_hidden_layers=3, sliding_window=32, original_max_position_embeddings=64,
                  rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                                   "short_factor": [1.0, 1.3, 1.9, 2.6], "long_factor": [1.2, 2.5, 4.0, 7.5]})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2, sliding_window=20)),
}


def family_config(family: str, **fields):
    """The transformers config of a tiny ``family`` model: ``BASE``, the family's fields, then ``fields``."""
    config_cls, arch, own = FAMILIES[family]
    return getattr(transformers, config_cls)(**{**BASE, **own, **fields}, architectures=[arch])


def save_family_checkpoint(config, path: Path, *, seed: int = 0):
    """Build ``config``'s model with transformers (seed ``seed``; norms and biases perturbed so that their loading
    shows), save it as safetensors at ``path``; returns the model in eval mode, fp32, on the CPU."""
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(str(path))
    return model


def greedy_reference(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens for each prompt, exactly ``max_new_tokens`` of them (no EOS stop), one prompt at a
    time (eager attention, fp32)."""
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            input_ids = torch.tensor([ids])
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[], pad_token_id=0)
            outs.append(out[0, len(ids):].tolist())
    return outs
