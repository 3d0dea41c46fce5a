"""Model folders a user points ``brigade`` at: a config with its own code (which runs only with
``--trust-remote-code``), a config transformers cannot read, no tokenizer, a truncated weights file, and a model
folder given where ``generate`` wants its prompt. Each is one error line naming the problem, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import assert_one_line, parse, run_cli, run_main
from remote_server import find_free_port


@pytest.fixture
def remote_code_model(smollm2_path, tmp_path):
    """SmolLM2 whose config.json names its own config class (auto_map), as models with custom code do."""
    import json

    folder = tmp_path / "remote-code-model"
    folder.mkdir()
    for item in Path(smollm2_path).iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((Path(smollm2_path) / "config.json").read_text())
    config.update(model_type="custom_llama", auto_map={"AutoConfig": "configuration_custom.CustomConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_custom.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass CustomConfig(LlamaConfig):\n"
        "    model_type = \"custom_llama\"\n")
    return folder


def test_trust_remote_code_runs_the_models_config_code(remote_code_model, tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf-home")}  # where transformers copies the folder's code
    refused = run_cli("serve", str(remote_code_model), env=env)
    assert_one_line(refused, "brigade serve", "has its own config code (auto_map in config.json), which runs only "
                                              "with --trust-remote-code")
    proc = run_cli("generate", "The capital of France is", "--model", str(remote_code_model), "--trust-remote-code",
                   "--max-tokens", "3", "--max-model-len", "64", env=env)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    config = parse("serve", str(remote_code_model), "--trust-remote-code")
    from brigade.entrypoints.cli.engine_args import config_from_args

    assert config_from_args(config).model_config.trust_remote_code
    assert not config_from_args(parse("serve", str(remote_code_model))).model_config.trust_remote_code


def test_a_config_that_transformers_cannot_read_is_one_line(remote_code_model, tmp_path):
    """The folder's own config code missing (OSError from transformers), and a config.json that is not JSON:
    one line each, not a traceback."""
    env = {"HF_HOME": str(tmp_path / "hf-home")}
    (remote_code_model / "configuration_custom.py").unlink()
    missing = run_cli("serve", str(remote_code_model), "--trust-remote-code", env=env)
    assert_one_line(missing, "brigade serve", "cannot read the config of")
    (remote_code_model / "config.json").write_text("{not json")
    broken = run_main("serve", str(remote_code_model), env=env)
    assert_one_line(broken, "brigade serve", "cannot read the config of")


def _copy_model(src: Path, dst: Path, *, tokenizer: bool) -> Path:
    dst.mkdir()
    for entry in src.iterdir():
        is_tokenizer = entry.name.startswith(("tokenizer", "special_tokens", "vocab", "merges"))
        if entry.is_file() and (tokenizer or not is_tokenizer):
            (dst / entry.name).symlink_to(entry)
    return dst


def test_serve_a_folder_without_a_tokenizer_is_one_line(smollm2_path, tmp_path):
    model = _copy_model(smollm2_path, tmp_path / "no-tokenizer", tokenizer=False)
    line = assert_one_line(run_main("serve", str(model)), "brigade serve", "has no tokenizer "
                           "(tokenizer.json / tokenizer_config.json)")
    assert str(model) in line and "--tokenizer" in line and "--skip-tokenizer-init" in line, line
    assert "sentencepiece" not in line and "tiktoken" not in line


def test_a_truncated_weights_file_is_named(smollm2_path, tmp_path):
    model = _copy_model(smollm2_path, tmp_path / "truncated", tokenizer=True)
    [weights] = [p for p in model.iterdir() if p.suffix == ".safetensors"]
    data = weights.read_bytes()[:64]
    weights.unlink()
    weights.write_bytes(data)
    proc = run_cli("serve", str(model), "--port", str(find_free_port()), "--dtype", "float32")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("brigade serve: error: the engine failed to start: "), proc.stderr[-3000:]
    assert f"cannot read the weights file {str(weights)!r}" in last and "truncated or corrupt" in last, last


def test_generate_with_the_model_first_names_the_real_problem(smollm2_path):
    assert_one_line(run_main("generate", str(smollm2_path), "--max-tokens", "-1"), "brigade generate",
                    "argument --max-tokens: must be at least 1, got -1")
    line = assert_one_line(run_main("generate", str(smollm2_path), "--max-tokens", "4"), "brigade generate",
                           f"the prompt {str(smollm2_path)!r} is a directory and no MODEL follows it")
    assert "brigade generate PROMPT MODEL" in line and "no model given" not in line, line
