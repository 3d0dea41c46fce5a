"""Fixtures of the LoRA tests: seeded PEFT adapters for SmolLM2 and their HF merged-weight references."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoints"))  # remote_server, for the server tests

from lora_utils import (ALL_MODULES, MAX_NEW_TOKENS, PROMPTS, hf_greedy, merged_lora,  # noqa: E402
                        write_adapter)



@pytest.fixture(scope="session")
def smollm2_config(smollm2_path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(smollm2_path))


@pytest.fixture(scope="session")
def lora_adapters(tmp_path_factory, smollm2_config) -> dict[str, Path]:
    """Two adapters: "sql" (every projection, rank 8) and "poet" (q, v, gate, down at rank 4, rsLoRA)."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": write_adapter(root / "sql", smollm2_config, seed=1, rank=8, alpha=16, targets=ALL_MODULES),
        "poet": write_adapter(root / "poet", smollm2_config, seed=2, rank=4, alpha=8, use_rslora=True,
                              targets=("q_proj", "v_proj", "gate_proj", "down_proj"), std=0.08),
    }


@pytest.fixture(scope="session")
def prompt_ids(smollm2_path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="session")
def hf_lora_tokens(smollm2_path, lora_adapters, prompt_ids) -> dict[str, list[list[int]]]:
    """Greedy tokens of HF transformers in fp32, per adapter name (and None: the base model), per prompt."""
    import contextlib

    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(smollm2_path), dtype=torch.float32).eval()
    out = {}
    for name in [None, *lora_adapters]:
        with contextlib.nullcontext() if name is None else merged_lora(model, lora_adapters[name]):
            out[name] = [hf_greedy(model, ids, MAX_NEW_TOKENS) for ids in prompt_ids]
    return out
