"""``brigade serve`` on a mixture-of-experts model it cannot run as configured: one line at start-up naming what is
unsupported, before any weight is read (the folders hold a config.json and a tokenizer, no weights)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import assert_one_line, run_main

QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 49152,
             "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
             "num_experts_per_tok": 2, "norm_topk_prob": True, "max_position_embeddings": 256}


def _config_only(smollm2_path, root: Path, **overrides) -> Path:
    root.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(smollm2_path) / name, root / name)
    (root / "config.json").write_text(json.dumps({**QWEN3_MOE, **overrides}))
    return root


@pytest.mark.parametrize("overrides,flags,needle", [
    ({}, ["--enable-lora"], "Qwen3Moe: LoRA on mixture-of-experts models is not supported yet"),
    ({"scoring_func": "sigmoid"}, [], "Qwen3Moe: router scoring function 'sigmoid' is not supported"),
], ids=["lora", "sigmoid-router"])
def test_unsupported_moe_setups_are_one_line(smollm2_path, tmp_path, overrides, flags, needle):
    model = _config_only(smollm2_path, tmp_path / "m", **overrides)
    proc = run_main("serve", str(model), *flags)
    assert_one_line(proc, "brigade serve", needle)
