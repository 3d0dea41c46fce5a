"""``benchmarks/kv_capacity.py``: the count of sequences a KV cache config holds, on hand-built configs of the
Gemma-3-12B shape, and one CPU engine run on tiny Llama configs (its KV cache config read from the engine), with the
shape summary's rows made from that run's JSON."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig

from brigade.interfaces.kv_cache_spec import (FullAttentionSpec, KVCacheConfig, KVCacheGroup, SlidingWindowSpec,
                                              cdiv, group_layers)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "kv_capacity.py"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gemma3_12b(all_full: bool, bytes_per_layer_block: int = 4) -> KVCacheConfig:
    """Gemma-3-12B's 48 layers (every 6th full, window 1024, 8 KV heads of 256, bf16, 16-token blocks), in a pool
    of ``bytes_per_layer_block`` x the all-full model's blocks' worth of layer pages, grouped as the engine does."""
    full = FullAttentionSpec(16, 8, 256, "bfloat16")
    window = SlidingWindowSpec(16, 8, 256, "bfloat16", sliding_window=1024)
    specs = {i: full if all_full or (i + 1) % 6 == 0 else window for i in range(48)}
    groups = group_layers(specs)
    pages = 48 * 1000 * bytes_per_layer_block  # the same memory for both: blocks = pages // tensors
    return KVCacheConfig(pages // max(len(g.layer_ids) for g in groups), groups)


def test_sequences_that_fit_follow_each_groups_peak():
    kv = _module("kv_capacity")
    hybrid, full = _gemma3_12b(False), _gemma3_12b(True)
    assert [(g.spec.kind, len(g.layer_ids)) for g in hybrid.groups] == [("full", 8)] + [("sliding_window", 8)] * 5
    assert hybrid.num_blocks == 6 * full.num_blocks  # a block id spans 8 tensors, not 48
    assert kv.blocks_per_sequence(full, 8192, 2048) == 512
    window_blocks = cdiv(1023 + 2048, 16) + 1
    assert kv.blocks_per_sequence(hybrid, 8192, 2048) == 512 + 5 * window_blocks
    assert kv.sequences_that_fit(hybrid, 8192, 2048) == (hybrid.num_blocks - 1) // (512 + 5 * window_blocks)
    assert kv.sequences_that_fit(full, 8192, 2048) == (full.num_blocks - 1) // 512
    # A step budget of 8192 tokens: a window group holds every block of an 8192-token sequence during its prefill.
    assert kv.blocks_per_sequence(hybrid, 8192, 8192) == 6 * 512
    # While decoding, a window group holds its window plus one block.
    assert kv.blocks_per_sequence(hybrid, 8192, 1) == 512 + 5 * (cdiv(1024, 16) + 1)
    described = kv.describe(hybrid, 8192, 2048)
    window_group = described["groups"][1]
    assert window_group["sliding_window"] == 1024 and window_group["blocks_peak"] == window_blocks
    assert window_group["bytes_peak"] == window_blocks * 8 * (2 * 16 * 8 * 256 * 2)
    assert window_group["bytes_if_full"] == 512 * 8 * (2 * 16 * 8 * 256 * 2)
    assert described["fit_decoding"] > described["fit"] > kv.sequences_that_fit(full, 8192, 2048)


def _tiny_llama(path: Path, layers: int) -> str:
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(path)
    return str(path)


def test_engine_run_on_the_cpu_and_its_summary_rows(tmp_path):
    """Two tiny engines with the same KV memory: half the layers hold twice the sequences."""
    two, four, out = _tiny_llama(tmp_path / "two", 2), _tiny_llama(tmp_path / "four", 4), tmp_path / "kv.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), two, "--against", four, "--seq-len", "256", "--json", str(out),
                           "--load-format", "dummy", "--dtype", "float32", "--skip-tokenizer-init",
                           "--max-model-len", "256", "--kv-cache-memory", "0.01"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    small, large = result["models"]
    for model, layers in ((small, 2), (large, 4)):
        page = 2 * 16 * 2 * 16 * 4  # K and V, 16-token blocks, 2 KV heads of 16, fp32
        assert model["bytes_per_block"] == layers * page
        assert model["num_blocks"] == int(0.01 * 2**30) // (layers * page)
        assert [g["layers"] for g in model["groups"]] == [list(range(layers))] and model["groups"][0]["kind"] == "full"
        assert model["fit"] == model["fit_decoding"] == (model["num_blocks"] - 1) // (256 // 16)
    assert result["ratio"] == pytest.approx(small["fit"] / large["fit"])
    assert 1.9 < result["ratio"] < 2.1  # twice the blocks, up to the floors of each count
    (tmp_path / "shape_kv_capacity.json").write_text(out.read_text())
    (row,) = [r for r in _module("suite_summary").summarize(tmp_path) if r["bench"] == "shape_3"]
    assert row["figure"] == result["ratio"] and f"{small['fit']} against {large['fit']}" in row["peer"]
