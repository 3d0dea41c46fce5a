"""Engine commands without a model (``brigade generate``/``bench``/``serve``) use the model ``scripts/setup.sh``
built, ``$BRIGADE_CACHE_DIR/models/SmolLM2-135M-Instruct``, and say so in one stderr line; with no such folder
the "no model given" error stays one line and names how to get it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_main
from remote_server import brigade_command

from brigade.cache_paths import DEFAULT_MODEL_NAME, cache_dir, default_model, default_model_dir
from brigade.config import ConfigError
from brigade.entrypoints.cli import bench, generate, serve
from brigade.entrypoints.cli.engine_args import config_from_args, model_path

CHOICES = {"quantization": [], "attention_backend": ["reference"], "kv_connector": [], "io_processor": []}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="brigade")
    subparsers = parser.add_subparsers(dest="command")
    serve.add_parser(subparsers, CHOICES)
    generate.add_parser(subparsers, CHOICES)
    bench.add_parser(subparsers, CHOICES)
    return parser.parse_args(list(argv))


def using_line(path) -> str:
    return f"no model given: using the set-up's {DEFAULT_MODEL_NAME} at {path}"


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    return subprocess.run([*brigade_command(), *argv], capture_output=True, text=True, timeout=180,
                          env={**base, **(env or {})})


def test_the_cache_rule(monkeypatch, tmp_path):
    monkeypatch.delenv("BRIGADE_CACHE_DIR", raising=False)
    assert cache_dir() == cache_dir("~/.cache/brigade") and str(cache_dir()).endswith("/.cache/brigade")
    monkeypatch.setenv("BRIGADE_CACHE_DIR", str(tmp_path))
    assert default_model_dir() == tmp_path / "models" / DEFAULT_MODEL_NAME
    assert default_model() is None  # not built there
    (tmp_path / "models" / DEFAULT_MODEL_NAME).mkdir(parents=True)
    assert default_model() is None  # a folder without config.json is no model
    (tmp_path / "models" / DEFAULT_MODEL_NAME / "config.json").write_text("{}")
    assert default_model() == tmp_path / "models" / DEFAULT_MODEL_NAME


def test_fetch_model_script_uses_the_same_rule(tmp_path):
    script = Path(__file__).resolve().parents[3] / "scripts" / "fetch_model.py"
    proc = subprocess.run([sys.executable, str(script), "--print-path"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "BRIGADE_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "models" / DEFAULT_MODEL_NAME)


@pytest.mark.parametrize("argv", [["serve"], ["generate", "Hi"], ["bench", "latency"], ["bench", "throughput"],
                                  ["bench", "serve"]])
def test_each_engine_command_takes_the_set_up_model_and_says_so_once(smollm2_path, capsys, argv):
    args = parse(*argv)
    assert model_path(args) == str(smollm2_path)
    assert args.model == str(smollm2_path)  # later calls, and bench serve --launch's flags, name it
    assert model_path(args) == str(smollm2_path)
    assert capsys.readouterr().err.splitlines() == [using_line(smollm2_path)]


def test_serve_config_without_a_model_is_the_set_up_model(smollm2_path, capsys):
    config = config_from_args(parse("serve", "--served-model-name", "smol"))
    assert config.model_config.model == str(smollm2_path)
    assert capsys.readouterr().err.splitlines() == [using_line(smollm2_path)]


def test_swallowed_model_errors_still_come_first(smollm2_path, capsys):
    """A MODEL taken by a flag of several values is still named, not replaced by the default."""
    with pytest.raises(ConfigError, match="--served-model-name also took"):
        model_path(parse("serve", "--served-model-name", "a", str(smollm2_path)))
    with pytest.raises(ConfigError, match="is a directory and no MODEL follows it"):
        model_path(parse("generate", str(smollm2_path)))
    assert capsys.readouterr().err == ""


def test_no_set_up_model_is_todays_error(monkeypatch, tmp_path):
    monkeypatch.setenv("BRIGADE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        model_path(parse("bench", "latency"))
    message = str(info.value)
    assert message.startswith("no model given; pass an HF-format model directory: brigade bench latency MODEL")
    assert "./scripts/setup.sh" in message and str(tmp_path / "models" / DEFAULT_MODEL_NAME) in message
    assert "\n" not in message


def test_generate_without_a_model(smollm2_path):
    proc = run_cli("generate", "--max-tokens", "2", "--max-model-len", "64", "--json", "Hi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[0] == using_line(smollm2_path), proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["token_ids"]) == 2, proc.stdout


@pytest.mark.parametrize("argv,usage", [(["generate", "Hi"], "brigade generate PROMPT MODEL"),
                                        (["serve"], "brigade serve MODEL"),
                                        (["bench", "latency"], "brigade bench latency MODEL")])
def test_no_set_up_model_is_one_line(tmp_path, argv, usage):
    proc = run_main(*argv, env={"BRIGADE_CACHE_DIR": str(tmp_path)})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"brigade {' '.join(argv[:2]) if argv[0] == 'bench' else argv[0]}: error: no model "
                               f"given; pass an HF-format model directory: {usage}"), lines[0]
    assert "./scripts/setup.sh" in lines[0], lines[0]
