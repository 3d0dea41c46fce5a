"""``brigade bench``'s lengths and address: lengths beyond the model are refused before the engine loads, lengths
given with a dataset that draws its own are refused and not recorded, and ``bench serve --host/--port`` build the
base URL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import assert_one_line, parse, run_cli, run_main
from cli_server import MODEL_NAME


@pytest.mark.parametrize("argv,limit", [
    (["latency", "--input-len", "100000"], "8192 (the model's max_position_embeddings)"),
    (["latency", "--input-len", "60", "--output-len", "8", "--max-model-len", "64"], "64 (--max-model-len)"),
    (["throughput", "--input-len", "100000", "--num-prompts", "2"], "8192 (the model's max_position_embeddings)"),
])
def test_bench_lengths_are_checked_before_the_engine_loads(smollm2_path, argv, limit):
    command, *flags = argv
    proc = run_main("bench", command, str(smollm2_path), *flags)
    line = assert_one_line(proc, f"brigade bench {command}", "exceeds the max model length " + limit)
    assert "keep their sum at most" in line and "tensors from" not in proc.stderr
    assert "KV cache" not in proc.stderr and "iteration" not in proc.stdout


def test_bench_serve_host_and_port_build_the_base_url(smollm2_path, server):
    """vLLM's bench serve --host/--port: the server measured is http://HOST:PORT unless --base-url is given."""
    from urllib.parse import urlparse

    port = str(urlparse(server.base_url).port)
    out = Path(server.log.name).with_suffix(".bench.json")
    proc = run_cli("bench", "serve", str(smollm2_path), "--host", "127.0.0.1", "--port", port, "--num-prompts", "2",
                   "--input-len", "8", "--output-len", "4", "--served-model-name", MODEL_NAME, "--output-json",
                   str(out))
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        import json

        record = json.loads(out.read_text())
        assert record["config"]["benchmark"]["base_url"] == server.base_url, record["config"]
    finally:
        out.unlink(missing_ok=True)
    assert parse("bench", "serve", "--port", "9001").port == 9001
    assert_one_line(run_main("bench", "serve", str(smollm2_path), "--port", "70000"), "brigade bench serve",
                    "argument --port: must be in 1..65535, got 70000")
    assert_one_line(run_main("bench", "serve", str(smollm2_path), "--host", "127.0.0.1", "--base-url",
                             "http://127.0.0.1:8000"), "brigade bench serve",
                    "--base-url and --host/--port both name the server; give one")


FAST = ("--max-model-len", "24", "--load-format", "dummy", "--enforce-eager", "--dtype", "float32")


@pytest.mark.parametrize("command,flags,given", [
    ("serve", ["--input-len", "16", "--output-len", "4"], "--input-len and --output-len"),
    ("serve", ["--output-len", "4"], "--output-len"),
    ("throughput", ["--input-len", "16"], "--input-len"),
])
def test_bench_lengths_with_a_sharegpt_like_dataset_are_refused(smollm2_path, command, flags, given):
    proc = run_main("bench", command, str(smollm2_path), "--dataset", "sharegpt-like", "--num-prompts", "2", *flags,
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


def test_bench_latency_iterations_are_sized_for_the_device():
    """vLLM's 10 warm-up and 30 timed batches on an accelerator; on the CPU, where one batch of the default sizes
    takes seconds, 1 and 3; given values always win."""
    from brigade.entrypoints.cli.bench import (LATENCY_ITERATIONS, LATENCY_ITERATIONS_CPU,
                                               resolve_latency_iterations)

    args = parse("bench", "latency")
    assert (args.num_iters_warmup, args.num_iters) == (None, None)
    resolve_latency_iterations(args, "cpu")
    assert (args.num_iters_warmup, args.num_iters) == LATENCY_ITERATIONS_CPU == (1, 3)
    args = parse("bench", "latency")
    resolve_latency_iterations(args, "cuda")
    assert (args.num_iters_warmup, args.num_iters) == LATENCY_ITERATIONS == (10, 30)
    args = parse("bench", "latency", "--num-iters-warmup", "0", "--num-iters", "7")
    resolve_latency_iterations(args, "cpu")
    assert (args.num_iters_warmup, args.num_iters) == (0, 7)


def test_bench_serve_is_a_client_that_loads_no_plugin_and_no_platform(smollm2_path):
    proc = run_cli("bench", "serve", str(smollm2_path), "--base-url", "http://127.0.0.1:9", "--num-prompts", "2",
                   env={"BRIGADE_LOGGING_LEVEL": "DEBUG"})
    assert proc.returncode != 0 and "cannot reach a server" in proc.stderr, proc.stderr[-3000:]
    assert "loaded plugin" not in proc.stderr and "plugins: " not in proc.stderr, proc.stderr[-3000:]
    assert "platform " not in proc.stderr, proc.stderr[-3000:]
