"""Helpers the quantized-model tests share (tests/quant/test_gptq_model.py, test_awq_model.py): transformers'
greedy reference on a dequantized checkpoint, a weightless SmolLM2 folder for start-up checks (and the one-line
refusal ``brigade serve``'s checks give it), and ``brigade serve`` run with a quantization plugin left unloaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from cli_runner import assert_one_line, serve_args
from remote_server import brigade_command


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int
              ) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy tokens and their logprobs (log_softmax of the raw fp32 logits) on the CPU, one
    prompt at a time, not stopping at EOS (as tests/conftest.py's HFReference: EOS is not masked, only not a stop)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False,
                                 eos_token_id=[], pad_token_id=0, output_logits=True, return_dict_in_generate=True)
            tokens = out.sequences[0, len(ids):].tolist()
            logprobs = [torch.log_softmax(step[0].float(), dim=-1)[t].item() for t, step in zip(tokens, out.logits)]
            outs.append((tokens, logprobs))
    return outs


def config_only_model(smollm2_path: Path, root: Path, *, quantization_config: dict | None, **overrides) -> Path:
    """A SmolLM2 folder with config.json and tokenizer but no weights: enough for ``brigade serve``'s checks."""
    root.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(smollm2_path / name, root / name)
    config = {**json.loads((smollm2_path / "config.json").read_text()), **overrides}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (root / "config.json").write_text(json.dumps(config))
    return root


def serve_with_only_fp8(model: Path) -> subprocess.CompletedProcess:
    """``brigade serve MODEL`` at the default log level with only the fp8 quantization plugin loaded
    (``BRIGADE_PLUGINS=fp8``): the other quantization packages are installed but behave as if they were not."""
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    env["BRIGADE_PLUGINS"] = "fp8"
    return subprocess.run([*brigade_command(), "serve", str(model)], capture_output=True, text=True, timeout=120,
                          env=env)


def serve_check_refusal(smollm2_path: Path, root: Path, quantization_config: dict, **overrides) -> str:
    """The ConfigError that ``brigade serve``'s checks raise, in one line, for a weightless SmolLM2 folder with
    ``quantization_config`` and ``overrides`` in its config.json (written under ``root``)."""
    from brigade.config import ConfigError
    from brigade.entrypoints.cli import serve

    model = config_only_model(Path(smollm2_path), root, quantization_config=quantization_config, **overrides)
    with pytest.raises(ConfigError) as info:
        serve.check(serve_args(str(model)))
    assert "\n" not in str(info.value), str(info.value)
    return str(info.value)


def assert_unloaded_method_names_its_package(smollm2_path: Path, root: Path, quantization_config: dict,
                                             method: str) -> None:
    """``brigade serve`` on a checkpoint quantized with ``method`` while only the fp8 plugin loads stops with one
    line naming the method, the package to install (``brigade-METHOD``) and the methods that are installed."""
    model = config_only_model(Path(smollm2_path), root, quantization_config=quantization_config)
    proc = serve_with_only_fp8(model)  # the method's package installed but not loaded: as if it were not installed
    assert_one_line(proc, "brigade serve", f"the checkpoint is quantized with '{method}'")
    assert f"install brigade-{method} (pip install brigade-{method})" in proc.stderr
    assert "installed methods: compressed-tensors, fp8" in proc.stderr
