"""A fresh user's review of the command line (review 13): ``brigade chat`` on non-UTF-8 input, model folders
without a tokenizer or with a truncated weights file, ``generate MODEL`` with a bad flag, and ``bench``'s
lengths with a dataset that does not use them. Real subprocesses, no mocks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from remote_server import brigade_command, find_free_port
from test_review12_cli import assert_one_line, run_cli


# ---- 2: brigade chat on input that is not UTF-8 -------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["utf-8:surrogateescape", "utf-8:strict"])
def test_chat_input_that_is_not_utf8_is_one_line_and_status_1(encoding):
    """The bad line is caught before any request (--model given, so nothing is listed): no server needed. A C
    locale reads stdin with surrogateescape (the bad bytes would fail when the request is encoded), a UTF-8 one
    strictly (they fail in ``input``): both give the same line."""
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    env["PYTHONIOENCODING"] = encoding
    url = f"http://127.0.0.1:{find_free_port()}"
    proc = subprocess.run([*brigade_command(), "chat", "--url", url, "--model", "x", "--max-tokens", "4"],
                          input=b"\xff\xfe hello\n", capture_output=True, timeout=120, env=env)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, stderr[-3000:]
    assert stderr.splitlines() == ["brigade chat: error: the input line is not valid UTF-8; type or pipe UTF-8 "
                                   "text"], stderr[-3000:]


# ---- 3: bad model folders; generate MODEL --max-tokens -1 ---------------------------------------------------

def _copy_model(src: Path, dst: Path, *, tokenizer: bool) -> Path:
    dst.mkdir()
    for entry in src.iterdir():
        is_tokenizer = entry.name.startswith(("tokenizer", "special_tokens", "vocab", "merges"))
        if entry.is_file() and (tokenizer or not is_tokenizer):
            (dst / entry.name).symlink_to(entry)
    return dst


def test_serve_a_folder_without_a_tokenizer_is_one_line(smollm2_path, tmp_path):
    model = _copy_model(smollm2_path, tmp_path / "no-tokenizer", tokenizer=False)
    line = assert_one_line(run_cli("serve", str(model)), "brigade serve", "has no tokenizer "
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
    assert_one_line(run_cli("generate", str(smollm2_path), "--max-tokens", "-1"), "brigade generate",
                    "argument --max-tokens: must be at least 1, got -1")
    line = assert_one_line(run_cli("generate", str(smollm2_path), "--max-tokens", "4"), "brigade generate",
                           f"the prompt {str(smollm2_path)!r} is a directory and no MODEL follows it")
    assert "brigade generate PROMPT MODEL" in line and "no model given" not in line, line


# ---- 4: bench lengths with a dataset that does not use them -------------------------------------------------

FAST = ("--max-model-len", "24", "--load-format", "dummy", "--enforce-eager", "--dtype", "float32")

@pytest.mark.parametrize("command,flags,given", [
    ("serve", ["--input-len", "16", "--output-len", "4"], "--input-len and --output-len"),
    ("serve", ["--output-len", "4"], "--output-len"),
    ("throughput", ["--input-len", "16"], "--input-len"),
])
def test_bench_lengths_with_a_sharegpt_like_dataset_are_refused(smollm2_path, command, flags, given):
    proc = run_cli("bench", command, str(smollm2_path), "--dataset", "sharegpt-like", "--num-prompts", "2", *flags,
                   *FAST)
    assert_one_line(proc, f"brigade bench {command}", f"{given} apply to --dataset random only; --dataset "
                                                      f"sharegpt-like draws its own lengths")


def test_bench_throughput_records_lengths_only_when_used(smollm2_path, tmp_path):
    out = tmp_path / "record.json"
    proc = run_cli("bench", "throughput", str(smollm2_path), "--dataset", "sharegpt-like", "--num-prompts", "1",
                   *FAST, "--output-json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = json.loads(out.read_text())["config"]["benchmark"]
    assert bench["dataset"] == "sharegpt-like" and bench["num_prompts"] == 1, bench
    assert "input_len" not in bench and "output_len" not in bench, bench
    shutil.rmtree(tmp_path, ignore_errors=True)
