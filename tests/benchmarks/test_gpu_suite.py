"""The GPU headline suite's script and summary, checked without a GPU: argument handling, the commands a part
runs (``--dry-run``), and the summary of a kept result folder."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks" / "run_gpu_suite.sh"
RESULTS = ROOT / "benchmarks" / "results" / "h200" / "2026-12-01T1615Z"  # benches 0-4 of one call
FP8_MOE_RESULTS = RESULTS.with_name("2026-12-01T2330Z")  # the headline suite with FP8 and MoE benches 1-4
SERVE_RESULTS = RESULTS.with_name("2026-12-01T1625Z")  # bench 5 of the next

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _summary_module():
    spec = importlib.util.spec_from_file_location("suite_summary", ROOT / "benchmarks" / "suite_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SUITE), "--dry-run", "--no-setup", *args], capture_output=True, text=True,
                          timeout=60)


def test_part_1_runs_limits_and_benches_1_to_4_without_the_server():
    result = _dry_run("--part", "1", "--run-name", "check")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "device_limits.py" in out
    assert "brigade bench latency" in out and "--hf-peer generate" in out and "--num-iters 5" in out
    assert "--num-prompts 1000 --input-len 1024" in out
    assert "--dataset sharegpt-like --num-prompts 1000" in out
    assert "brigade serve" not in out
    assert "benchmarks/results/" in out and "/check/latency.json" in out


def test_part_2_runs_the_sharegpt_peers_and_serving_and_quick_cuts_prompts():
    result = _dry_run("--part", "2", "--quick")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "--hf-peer both --hf-batch-size 4" in out
    assert "brigade serve" in out and "--skip-tokenizer-init" in out
    assert [line for line in out.splitlines() if "--request-rate" in line]
    assert "brigade bench latency" not in out


@pytest.mark.parametrize("args", [["--bench", "7"], ["--bench", "s5"], ["--part", "6"], ["--no-such-flag"]])
def test_bad_arguments_are_refused(args):
    assert _dry_run(*args).returncode == 2


def test_summary_of_a_kept_result_folder():
    rows = {row["bench"] + "|" + row["name"]: row for row in _summary_module().summarize(RESULTS)}
    latency = next(row for key, row in rows.items() if key.startswith("bench1|"))
    assert latency["figure"] == pytest.approx(3.994, abs=1e-3)
    assert latency["ratio"] == pytest.approx(1.116, abs=1e-3) and latency["met"] is True
    peers = next(row for key, row in rows.items() if key.startswith("bench4|"))
    assert peers["ratio"] == pytest.approx(4.27, abs=0.01) and peers["met"] is False
    penalized = next(row for key, row in rows.items() if key.startswith("bench3p|"))
    assert penalized["ratio"] == pytest.approx(0.540, abs=1e-3) and penalized["met"] is False
    serve_rows = {row["bench"] + "|" + row["name"]: row for row in _summary_module().summarize(SERVE_RESULTS)}
    serve = next(row for key, row in serve_rows.items() if key.startswith("bench5_16|"))
    assert serve["figure"] == pytest.approx(5.156, abs=0.01) and serve["met"] is True


def test_summary_against_a_baseline_counts_a_faster_tpot_as_better(tmp_path):
    summary = _summary_module()
    record = json.loads((RESULTS / "latency.json").read_text())
    record["results"]["brigade"]["tpot_ms"]["median"] *= 0.9
    (tmp_path / "latency.json").write_text(json.dumps(record))
    rows = summary.summarize(tmp_path)
    summary.add_baseline(rows, summary.summarize(RESULTS))
    assert rows[0]["change_pct"] == pytest.approx(10.0)
    assert "+10.0%" in summary.markdown(rows)


def test_parts_3_and_4_run_the_fp8_and_moe_benches():
    out = _dry_run("--part", "3", "--run-name", "check").stdout
    assert "device_limits.py" in out and out.count("--quantization fp8") == 4 and "--kv-cache-dtype fp8" in out
    assert "--batch-size 64" in out and "/check/latency_b64.json" in out and "/check/fp8_latency_b64.json" in out
    out = _dry_run("--part", "4").stdout
    assert "benchmarks/configs/mixtral-8x7b" in out and "benchmarks/configs/qwen3-30b-a3b" in out
    assert "bench_fused_moe.py --tokens 1,8,64,512,4096" in out and "--quantization" not in out
    assert _dry_run("--bench", "f1,m5").stdout.count("+ [") == 2


def test_model_shapes_count_the_parameters_one_token_reads():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from model_shapes import kv_bytes_per_token, load_config, token_params

    configs = ROOT / "benchmarks" / "configs"
    dense = token_params(load_config(configs / "llama-3.1-8b"))
    # device_limits.py on the meta-device model: 15,009,857,536 bytes (these plus norms and one embedding row)
    assert dense.weight_bytes() == 15_009_316_864 and dense.router == 0
    assert dense.weight_bytes(1.0) == pytest.approx(8.03e9, rel=1e-3)
    mixtral = token_params(load_config(configs / "mixtral-8x7b"))  # 2 of 8 experts
    assert mixtral.total == pytest.approx(12.75e9, rel=1e-3) and mixtral.router == 32 * 4096 * 8
    qwen3 = token_params(load_config(configs / "qwen3-30b-a3b"))  # 8 of 128 experts of 768
    assert qwen3.total == pytest.approx(3.04e9, rel=1e-3)
    assert kv_bytes_per_token(load_config(configs / "llama-3.1-8b")) == 32 * 2 * 8 * 128 * 2


def test_decode_gemv_shapes_follow_each_config():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from model_shapes import decode_gemv_shapes, load_config

    assert decode_gemv_shapes(load_config(ROOT / "benchmarks/configs/llama-3.1-8b")) == {
        "qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336),
        "lm_head": (128256, 4096)}
    assert decode_gemv_shapes(load_config(ROOT / "benchmarks/configs/qwen3-30b-a3b")) == {
        "qkv_proj": (5120, 2048), "o_proj": (2048, 4096), "router": (128, 2048), "lm_head": (151936, 2048)}


def test_summary_of_the_fp8_and_moe_benches():
    rows = {row["bench"]: row for row in _summary_module().summarize(FP8_MOE_RESULTS)}
    assert rows["fp8_1"]["figure"] == pytest.approx(2.56, abs=0.01)
    assert rows["fp8_1"]["bound"] == pytest.approx(1.97, abs=0.01) and rows["fp8_1"]["met"] is False
    assert rows["fp8_1_bf16"]["ratio"] == pytest.approx(0.649, abs=1e-3)
    assert rows["fp8_2"]["ratio"] == pytest.approx(1.400, abs=1e-3)
    assert rows["fp8_4"]["bound"] == pytest.approx(2.50, abs=0.01)
    assert rows["moe_1"]["ratio"] == pytest.approx(1.227, abs=1e-3) and rows["moe_1"]["met"] is True
    assert rows["moe_2"]["ratio"] == pytest.approx(2.841, abs=1e-3) and rows["moe_2"]["met"] is False
    assert rows["moe_3"]["ratio"] == pytest.approx(0.439, abs=1e-3)
    assert "65.6 req/s" in rows["moe_4"]["peer"]


def test_part_5_runs_the_attention_shape_benches():
    out = _dry_run("--part", "5", "--run-name", "check").stdout
    lines = [line for line in out.splitlines() if line.startswith("+ [")]
    assert [line.split("]")[0][3:].split(",")[0] for line in lines] == [
        "limits", "shape-gemma2", "shape-gpt-oss", "shape-kv-capacity", "shape-long-prompt", "shape-long-prompt-kv"]
    common = "--load-format dummy --dtype bfloat16 --skip-tokenizer-init"
    for model in ("gemma-2-9b", "gpt-oss-20b"):
        line = next(line for line in lines if f"configs/{model} " in line)
        assert "brigade bench latency" in line and common in line and "--batch-size 1 --input-len 128" in line
        assert "--output-len 256" in line and f"/check/shape_latency_{model}.json" in line
    capacity = next(line for line in lines if "shape-kv-capacity" in line)
    assert "kv_capacity.py benchmarks/configs/gemma-3-12b --against benchmarks/configs/gemma-3-12b-all-full" in capacity
    assert "--seq-len 8192" in capacity and "--max-model-len 8192" in capacity and common in capacity
    assert "/check/shape_kv_capacity.json" in capacity
    long_prompt = next(line for line in lines if "[shape-long-prompt," in line)
    assert "configs/mistral-7b" in long_prompt and "--input-len 32640 --output-len 128" in long_prompt
    assert "--max-model-len 32768" in long_prompt and "/check/shape_long_prompt_mistral-7b.json" in long_prompt
    kv = next(line for line in lines if "[shape-long-prompt-kv," in line)
    assert "kv_capacity.py benchmarks/configs/mistral-7b --seq-len 32768" in kv and "--max-model-len 32768" in kv
    assert _dry_run("--part", "shapes").stdout == _dry_run("--part", "5").stdout
    assert _dry_run("--bench", "s1,s4").stdout.count("+ [") == 3  # s4 is the latency and its KV config
    assert "shape-gemma2" in _dry_run("--part", "all").stdout


def test_model_shapes_of_gemma_and_gpt_oss_match_the_models_on_the_meta_device():
    """gpt-oss against Brigade's model (active experts: 4 of 32), Gemma 2 against transformers' own: every
    parameter but the norms, the tied embedding counted once (as the LM head every step reads)."""
    import sys

    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from device_limits import build_meta_model
    from model_shapes import kv_bytes_read, layer_windows, load_config, token_params

    configs = ROOT / "benchmarks" / "configs"
    config = load_config(configs / "gpt-oss-20b")
    by_kind = {"attention": 0, "router": 0, "experts": 0, "lm_head": 0}
    for name, param in build_meta_model(str(configs / "gpt-oss-20b"), torch.bfloat16).named_parameters():
        kind = ("attention" if ".self_attn." in name and ".sinks" not in name else "router" if ".mlp.gate." in name
                else "experts" if ".experts." in name else "lm_head" if name.startswith("lm_head") else None)
        if kind:
            by_kind[kind] += param.numel()
    oss = token_params(config)
    assert oss.router == by_kind["router"] and oss.lm_head == by_kind["lm_head"]
    experts = by_kind["experts"] * config["num_experts_per_tok"] // config["num_local_experts"]
    assert oss.projections == by_kind["attention"] + experts
    assert layer_windows(config)[:2] == [128, None]

    gemma_config = load_config(configs / "gemma-2-9b")
    with torch.device("meta"):
        gemma = Gemma2ForCausalLM(Gemma2Config(**gemma_config))
    counted = {id(p): p for n, p in gemma.named_parameters() if "norm" not in n}  # tied: one tensor
    gemma2 = token_params(gemma_config)
    assert gemma2.total == sum(p.numel() for p in counted.values())
    assert gemma2.lm_head == gemma.lm_head.weight.numel() == gemma_config["vocab_size"] * gemma_config["hidden_size"]
    windows = layer_windows(gemma_config)
    assert windows == [4096 if t == "sliding_attention" else None for t in gemma.config.layer_types]
    per_layer_token = 2 * 8 * 256 * 2  # K and V, 8 KV heads of 256, bf16
    assert kv_bytes_read(gemma_config, 384) == 42 * 384 * per_layer_token  # under the window: every layer whole
    assert kv_bytes_read(gemma_config, 8192) == (21 * 8192 + 21 * 4096) * per_layer_token
    assert layer_windows(load_config(configs / "mistral-7b")) == [4096] * 32
    assert layer_windows(load_config(configs / "llama-3.1-8b")) == [None] * 32


def test_shape_latency_bound_adds_the_kv_cache_read():
    """A kept batch-1 record (Llama-3.1-8B) through the shape row: weights plus KV at the mean context."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from model_shapes import kv_bytes_read, load_config, token_params

    summary = _summary_module()
    record = json.loads((RESULTS / "latency.json").read_text())
    bandwidth = json.loads((RESULTS / "limits.json").read_text())["copy_bandwidth_GBps"] * 1e9
    (row,) = summary._shape_latency_row("shape_1", "llama-3.1-8b", record, bandwidth)
    config = load_config(ROOT / "benchmarks" / "configs" / "llama-3.1-8b")
    read = token_params(config).weight_bytes() + kv_bytes_read(config, 128 + 256 / 2)
    assert row["bound"] == pytest.approx(read / bandwidth * 1e3)
    assert row["ratio"] == pytest.approx(row["figure"] / row["bound"]) and row["target"] == "<= 1.15x bound"
    assert row["met"] == (row["ratio"] <= 1.15) and "MB of KV cache" in row["peer"]
