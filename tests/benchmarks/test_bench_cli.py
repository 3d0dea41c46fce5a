"""``brigade bench {throughput,latency,serve}`` end to end on SmolLM2 with tiny sizes, through the real CLI.

Each run is a real subprocess (``python -m brigade.entrypoints.cli.main bench ...``) writing its JSON
record; the tests read the record back and check its metric keys and values.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B_DIR = REPO_ROOT / "benchmarks" / "configs" / "llama-3.1-8b"


def run_bench(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # One intra-op thread: these runs check the harness, not speed, and on a CI box shared with other
    # suites two OpenMP threads per process oversubscribe the cores and make HF's many small ops crawl.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "brigade.entrypoints.cli.main", "bench", *argv],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def load(path: Path) -> dict:
    record = json.loads(path.read_text())
    assert record["device"]["cpu_model"] and record["device"]["torch_num_threads"] >= 1
    assert record["argv"][:3] == ["brigade", "bench", record["kind"]]
    return record


def check_throughput(values: dict, num_requests: int, num_output: int) -> None:
    assert values["num_requests"] == num_requests and values["num_output_tokens"] == num_output
    assert values["elapsed_s"] > 0 and values["cpu_time_s"] > 0
    assert values["output_tokens_per_s"] == pytest.approx(num_output / values["elapsed_s"])
    assert values["total_tokens_per_s"] > values["output_tokens_per_s"] > 0
    assert values["requests_per_s"] == pytest.approx(num_requests / values["elapsed_s"])


def test_throughput_with_both_hf_peers_over_interleaved_repeats(smollm2_path, tmp_path):
    """One run checks the peers (``generate`` in static batches of 3 and ``generate_batch``), the interleaved
    rounds with their medians, and the repetition-penalty fraction."""
    out = tmp_path / "throughput.json"
    proc = run_bench("throughput", str(smollm2_path), "--dtype", "float32", "--kv-cache-memory", "0.25",
                     "--max-model-len", "2048", "--num-prompts", "4", "--input-len", "8", "--output-len", "4",
                     "--hf-peer", "both", "--hf-batch-size", "3", "--repeats", "3",
                     "--repetition-penalty-fraction", "0.25", "--output-json", str(out))
    assert "output tok/s ratio" in proc.stdout and "median of 3 interleaved rounds" in proc.stdout
    record = load(out)
    results = record["results"]
    names = ("brigade", "hf_generate", "hf_generate_batch")
    for name in names:
        check_throughput(results[name], 4, 16)
        assert len(results[name]["rounds"]) == 3
        for values in results[name]["rounds"]:
            check_throughput(values, 4, 16)
        speeds = sorted(v["output_tokens_per_s"] for v in results[name]["rounds"])
        assert results[name]["output_tokens_per_s"] == speeds[1]  # the median round
    assert results["hf_generate"]["batch_size"] == 3
    # 2 static batches (3 + 1 prompts) of 4 tokens each
    assert results["hf_generate"]["num_generated_tokens"] == 16
    for peer in ("hf_generate", "hf_generate_batch"):  # the median of the per-round ratios
        per_round = sorted(b["output_tokens_per_s"] / h["output_tokens_per_s"]
                           for b, h in zip(results["brigade"]["rounds"], results[peer]["rounds"]))
        assert record["ratios"][f"brigade/{peer}/output_tokens_per_s"] == pytest.approx(per_round[1])
    bench = record["config"]["benchmark"]
    assert (bench["num_prompt_tokens"], bench["num_output_tokens"], bench["sampling"]["ignore_eos"]) == (32, 16, True)
    assert record["config"]["engine"]["model_config"]["dtype"] == "float32"
    assert bench["repeats"] == 3
    # one of the four requests sampled with the default penalty, and still gave exactly its tokens
    assert (bench["repetition_penalty_fraction"], bench["repetition_penalty"]) == (0.25, 1.1)


def test_latency_with_hf_peer(smollm2_path, tmp_path):
    out = tmp_path / "latency.json"
    run_bench("latency", str(smollm2_path), "--dtype", "float32", "--kv-cache-memory", "0.25", "--max-model-len", "2048", "--batch-size", "2",
              "--input-len", "16", "--output-len", "6", "--num-iters-warmup", "1", "--num-iters", "2",
              "--hf-peer", "generate", "--output-json", str(out))
    record = load(out)
    for name in ("brigade", "hf_generate"):
        stats = record["results"][name]
        assert stats["num_iterations"] == 2 and stats["latency_ms"]["count"] == 2
        assert stats["ttft_ms"]["count"] == 4 and stats["tpot_ms"]["count"] == 4
        assert 0 < stats["ttft_ms"]["max"] < stats["latency_ms"]["max"]
        assert 0 < stats["tpot_ms"]["mean"] < stats["latency_ms"]["mean"]
        assert stats["latency_ms"]["min"] <= stats["latency_ms"]["median"] <= stats["latency_ms"]["p99"]
    assert record["ratios"]["hf_generate/brigade/latency_ms"] > 0


@pytest.fixture(scope="module")
def launched(smollm2_path, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, str]:
    """One ``bench serve --launch`` for the module's two tests that read its record: (the process, its record,
    the server's root). The base URL is given the usual OpenAI way, ending in /v1/."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        root = f"http://127.0.0.1:{sock.getsockname()[1]}"
    out = tmp_path_factory.mktemp("serve") / "serve.json"
    proc = run_bench("serve", str(smollm2_path), "--dtype", "float32", "--kv-cache-memory", "0.25", "--max-model-len", "2048", "--launch",
                     "--base-url", f"{root}/v1/", "--num-prompts", "5", "--input-len", "12",
                     "--output-len", "6", "--request-rate", "20", "--output-json", str(out))
    return proc, load(out), root


def test_serve_launches_a_server_and_streams(launched):
    proc, record, _ = launched
    assert "launching: brigade serve" in proc.stdout
    metrics = record["results"]["brigade"]
    assert (metrics["completed"], metrics["failed"]) == (5, 0)
    assert metrics["num_output_tokens"] == 30 and metrics["num_prompt_tokens"] == 60
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert metrics[key]["mean"] > 0, key
    assert metrics["ttft_ms"]["max"] < metrics["e2el_ms"]["max"]
    assert metrics["itl_ms"]["count"] >= 5  # at least one gap per request after its first chunk
    assert metrics["requests_per_s"] > 0 and metrics["output_tokens_per_s"] > 0
    assert record["config"]["benchmark"]["launched"] is True
    assert record["config"]["engine"]["model_config"]["dtype"] == "float32"


# (hidden, layers, heads, KV heads, intermediate, vocab, positions) and parameter count of the public configs.
LLAMA_SHAPES = {
    "llama-3.1-8b": ((4096, 32, 32, 8, 14336, 128256, 131072), 8_030_261_248),
    "llama-3.1-70b": ((8192, 80, 64, 8, 28672, 128256, 131072), 70_553_706_496),
}


@pytest.mark.parametrize("name", sorted(LLAMA_SHAPES))
def test_llama_configs_have_the_public_shapes(name):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = REPO_ROOT / "benchmarks" / "configs" / name
    shape, num_params = LLAMA_SHAPES[name]
    config = AutoConfig.from_pretrained(path)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.vocab_size, config.max_position_embeddings) == shape
    assert config.rope_parameters["rope_type"] == "llama3" and config.rope_parameters["factor"] == 8.0
    assert config.rope_parameters["rope_theta"] == 500000.0 and not config.tie_word_embeddings
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == num_params
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.decode(tokenizer.encode("héllo")) == "héllo"


def test_dummy_weights_on_a_shrunk_llama_8b_config(tmp_path, free_port):
    """The GPU commands' path (dummy weights, bf16, llama3 RoPE, synthetic tokenizer, sharegpt-like) at toy size."""
    model_dir = tmp_path / "llama-tiny"
    shutil.copytree(LLAMA_8B_DIR, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(hidden_size=64, head_dim=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128)
    (model_dir / "config.json").write_text(json.dumps(config))
    out = tmp_path / "dummy.json"
    run_bench("throughput", str(model_dir), "--load-format", "dummy", "--dtype", "bfloat16", "--max-model-len", "2048",
              "--kv-cache-memory", "0.25", "--max-model-len", "2048", "--dataset", "sharegpt-like", "--num-prompts", "3", "--hf-peer", "generate",
              "--output-json", str(out))
    record = load(out)
    bench = record["config"]["benchmark"]
    for name in ("brigade", "hf_generate"):
        check_throughput(record["results"][name], 3, bench["num_output_tokens"])
    assert record["config"]["engine"]["model_config"]["dtype"] == "bfloat16"
    assert record["config"]["engine"]["model_config"]["load_format"] == "dummy"
    # The server checks prompt ids against its (synthetic, 259-id) tokenizer: the prompts must respect it.
    out = tmp_path / "dummy_serve.json"
    run_bench("serve", str(model_dir), "--load-format", "dummy", "--dtype", "bfloat16", "--max-model-len", "2048",
              "--kv-cache-memory", "0.25", "--max-model-len", "2048", "--launch", "--base-url", f"http://127.0.0.1:{free_port}",
              "--num-prompts", "3", "--input-len", "10", "--output-len", "4", "--output-json", str(out))
    metrics = load(out)["results"]["brigade"]
    assert (metrics["completed"], metrics["num_output_tokens"]) == (3, 12)


def test_serve_accepts_an_openai_base_url_ending_in_v1(launched):
    """``--base-url http://HOST:PORT/v1/`` (the usual OpenAI base URL) is the server's root: /v1 is not doubled."""
    _, record, root = launched
    assert record["config"]["benchmark"]["base_url"] == root
    assert record["results"]["brigade"]["completed"] == 5


def test_serve_launch_refuses_a_port_another_server_listens_on(smollm2_path, tmp_path, free_port):
    """A launched server could not bind there, while the health poll would reach the other one and the
    benchmark would measure the wrong server: one line, status 1, nothing launched."""
    import socket

    with socket.create_server(("127.0.0.1", free_port)) as other:
        other.listen()
        proc = subprocess.run([sys.executable, "-m", "brigade.entrypoints.cli.main", "bench", "serve",
                               str(smollm2_path), "--launch", "--base-url", f"http://127.0.0.1:{free_port}",
                               "--num-prompts", "2", "--output-json", str(tmp_path / "x.json")],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"brigade bench serve: error: 127.0.0.1:{free_port} already has a server listening; stop it, or give "
        "--base-url another port for the launched one (or drop --launch to benchmark that one)")
    assert "Traceback" not in proc.stderr and not (tmp_path / "x.json").exists()
