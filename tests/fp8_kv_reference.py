"""The fp8 KV cache's transformers reference, shared by the CPU engine tests (tests/engine) and the GPU ones
(tests/cuda): a checkpoint with per-layer k/v scales added, and transformers' greedy tokens on it with its KV cache
storing each layer's new K/V as Brigade's fp8 cache returns them (``round_trip_kv`` at that layer's scales)."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import torch


def with_scales(src: Path, dst: Path, scales: dict[str, float]) -> Path:
    """A copy of the checkpoint at ``src`` with one-element float32 tensors ``scales`` (name -> value) added."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    file = dst / "model.safetensors"
    tensors = load_file(file)
    tensors.update({name: torch.tensor(value, dtype=torch.float32) for name, value in scales.items()})
    save_file(tensors, file, metadata={"format": "pt"})
    return dst


def transformers_fp8_greedy(path, prompts: list[list[int]], scales: list[tuple[float, float]],
                            max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy tokens and logprobs (``max_tokens`` each, in fp32 on the CPU) on the checkpoint at
    ``path``, its KV cache round-tripping each layer's new K/V through e4m3 at that layer's (k, v) scales."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from brigade.attention.fp8_kv import round_trip_kv

    class Fp8RoundTripCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            k_scale, v_scale = scales[layer_idx]
            return super().update(round_trip_kv(key_states, k_scale), round_trip_kv(value_states, v_scale),
                                  layer_idx, *args, **kwargs)

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    # transformers 5.24 names generate's cache argument `cache`; earlier 5.x (the GPU image's 5.17) `past_key_values`.
    parameters = inspect.signature(model.prepare_inputs_for_generation).parameters
    cache_argument = "cache" if "cache" in parameters else "past_key_values"
    results = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, do_sample=False, pad_token_id=0, output_scores=True,
                                 return_dict_in_generate=True,
                                 **{cache_argument: Fp8RoundTripCache(config=model.config)})
            tokens = out.sequences[0, len(prompt):].tolist()
            logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, tokens)]
            results.append((tokens, logprobs))
    return results
