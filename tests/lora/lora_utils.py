"""Test adapters in PEFT's format, written with safetensors (peft itself is not needed), and the reference:
HF transformers on the same base model with the LoRA delta merged into the weights by hand in fp32."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_NEW_TOKENS = 12  # greedy tokens compared with transformers in the LoRA tests
PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,"]

MODULE_BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def projection_shapes(config) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection of a Llama config."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = config.intermediate_size
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def write_adapter(folder: Path, config, *, seed: int, rank: int = 8, alpha: float = 16.0,
                  targets: tuple[str, ...] = ("q_proj", "v_proj"), layers: list[int] | None = None,
                  std: float = 0.05, use_rslora: bool = False, extra_config: dict | None = None) -> Path:
    """A PEFT LoRA folder with seeded random A and B (B non-zero, unlike PEFT's initialisation)."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes = projection_shapes(config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in (range(config.num_hidden_layers) if layers is None else layers):
        for module in targets:
            in_f, out_f = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.{MODULE_BLOCK[module]}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * std
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets), "bias": "none",
           "lora_dropout": 0.0, "use_rslora": use_rslora, "modules_to_save": None, "task_type": "CAUSAL_LM"}
    cfg.update(extra_config or {})
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


@contextlib.contextmanager
def merged_lora(model, adapter: Path):
    """Within the block, transformers' ``model`` (fp32) has ``W += scale * B @ A`` for every projection the
    PEFT ``adapter`` folder adapts; the original weights come back afterwards."""
    from safetensors.torch import load_file

    cfg = json.loads((adapter / "adapter_config.json").read_text())
    r = cfg["r"]
    scale = cfg["lora_alpha"] / (math.sqrt(r) if cfg.get("use_rslora") else r)
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    saved = {}
    with torch.no_grad():
        for key, a in tensors.items():
            if not key.endswith("lora_A.weight"):
                continue
            b = tensors[key.replace("lora_A", "lora_B")]
            name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            saved[name] = params[name].detach().clone()
            params[name].add_((scale * (b.float() @ a.float())).to(params[name].device))
    try:
        yield model
    finally:
        with torch.no_grad():
            for name, weight in saved.items():
                params[name].copy_(weight)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation with ignore-EOS semantics: exactly max_new_tokens tokens."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


# A tensor of every test adapter written with layers=[0] (the tests break it on purpose).
KEY = "base_model.model.model.layers.0.self_attn.q_proj"


def edit_config(path: Path, **changes) -> None:
    """Overwrite keys of the adapter folder's adapter_config.json."""
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))


def edit_tensors(path: Path, fn) -> None:
    """Rewrite the adapter folder's tensors through ``fn(tensors)``, which edits the dict in place."""
    from safetensors.torch import load_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    fn(tensors)
    save_file(tensors, str(path / "adapter_model.safetensors"))
