"""brigade-awq on the real SmolLM2 weights: an AWQ checkpoint made by ``awq_checkpoint`` (round-to-nearest with
zero points, packed in AutoAWQ's GEMM layout) run by Brigade in fp32 on the CPU gives the greedy tokens HF
transformers gives on the same codes dequantized into an ordinary fp32 checkpoint, with close logprobs; the
loaded layers hold the packed int32 tensors; the plugin comes from its installed entry point; and what cannot
run is refused in one line before anything starts.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from awq_checkpoint import E2E_GROUP_SIZE, awq_quantization_config
from quant_model_utils import assert_unloaded_method_names_its_package, hf_greedy, serve_check_refusal
from cli_runner import assert_one_line, run_main

from brigade import LLM, SamplingParams
from brigade_awq.method import AWQLinearMethod

BIN = Path(sys.executable).parent
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
MAX_NEW_TOKENS = 8


def test_entry_point_is_discovered_and_registers_awq():
    proc = subprocess.run([str(BIN / "brigade"), "plugins", "--json"], capture_output=True, text=True,
                          timeout=120, check=True)
    awq = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}["awq"]
    assert awq["distribution"] == "brigade-awq"
    assert awq["group"] == "brigade.general_plugins"
    assert awq["status"] == "loaded", awq["reason"]
    assert awq["registered"]["quantization_methods"] == ["awq"]


def test_greedy_tokens_and_logprobs_equal_transformers_on_the_dequantized_weights(awq_checkpoint):
    from transformers import AutoTokenizer

    awq_dir, ref_dir = awq_checkpoint
    tok = AutoTokenizer.from_pretrained(str(awq_dir))
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    want = hf_greedy(ref_dir, prompts, MAX_NEW_TOKENS)
    shutil.rmtree(ref_dir)  # 0.5 GB of float32; transformers held its own copy
    gc.collect()

    llm = LLM(str(awq_dir), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.1)  # detected, no flag
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True, logprobs=1)
    outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert [list(o.token_ids) for o in outs] == [w[0] for w in want]
    for out, w in zip(outs, want):
        got = [step[tid].logprob for step, tid in zip(out.logprobs, out.token_ids)]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(w[1]), rtol=0, atol=2e-3)

    # The linear layers hold the checkpoint's packed tensors, and nothing dequantized stays behind.
    model = llm.engine.core.executor.worker.model_runner.model
    linears = [m for m in model.modules() if hasattr(m, "quant_method")]
    assert len(linears) == 4 * len(model.model.layers)
    packed_bytes = dense_bytes = 0
    for m in linears:
        assert isinstance(m.quant_method, AWQLinearMethod)
        k, n = m.input_size, m.output_size
        g = k // E2E_GROUP_SIZE
        assert not hasattr(m, "weight")
        assert {name for name, _ in m.named_parameters()} == {"qweight", "qzeros", "scales"}
        assert (m.qweight.dtype, tuple(m.qweight.shape)) == (torch.int32, (k, n // 8))
        assert (m.qzeros.dtype, tuple(m.qzeros.shape)) == (torch.int32, (g, n // 8))
        assert (m.scales.dtype, tuple(m.scales.shape)) == (torch.float16, (g, n))
        packed_bytes += sum(p.numel() * p.element_size() for p in m.parameters())
        dense_bytes += k * n * 4
    assert packed_bytes < dense_bytes / 8 * 1.1  # 4-bit codes plus < 10% of scales and zeros
    assert model.model.embed_tokens.weight.dtype == torch.float32  # embeddings and the head are not AWQ
    del llm, model, linears
    gc.collect()


# ---- refused at start-up, in one line ------------------------------------------------------------------

AWQ_QC = awq_quantization_config(64)


@pytest.mark.parametrize("qc,overrides,needle", [
    ({**AWQ_QC, "bits": 8}, {}, "AWQ bits=8 is not supported; brigade-awq runs AutoAWQ GEMM checkpoints: bits 4"),
    ({**AWQ_QC, "zero_point": False}, {}, "AWQ zero_point=false (symmetric, no qzeros) is not supported"),
    ({**AWQ_QC, "version": "gemv"}, {}, "AWQ version 'gemv' is not supported"),
    ({**AWQ_QC, "version": "marlin"}, {}, "AWQ version 'marlin' is not supported"),
    ({**AWQ_QC, "version": "exllama"}, {}, "AWQ version 'exllama' is not supported"),
    ({**AWQ_QC, "modules_to_not_convert": ["vision_tower"]}, {},
     "AWQ modules_to_not_convert names 'vision_tower', which is no module of this llama model"),
    ({**AWQ_QC, "group_size": 128}, {},  # SmolLM2's hidden size 576 is not a multiple of 128
     "AWQ layer model.layers.0.self_attn.qkv_proj: in_features 576 is not a multiple of group_size 128"),
    (AWQ_QC, {"intermediate_size": 1540},  # gate_up is built first and refuses its out_features
     "AWQ layer model.layers.0.mlp.gate_up_proj: out_features 1540 (of [1540, 1540]) is not a multiple of 8"),
])
def test_unsupported_checkpoints_are_refused_by_serves_checks(smollm2_path, tmp_path, qc, overrides, needle):
    assert needle in serve_check_refusal(smollm2_path, tmp_path / "m", qc, **overrides)


def test_quantization_awq_on_an_unquantized_checkpoint_is_one_line(smollm2_path):
    proc = run_main("serve", str(smollm2_path), "--quantization", "awq")
    assert_one_line(proc, "brigade serve", "--quantization awq needs an AWQ checkpoint")


def test_an_awq_checkpoint_without_the_plugin_names_the_package(smollm2_path, tmp_path):
    assert_unloaded_method_names_its_package(smollm2_path, tmp_path / "m", AWQ_QC, "awq")
