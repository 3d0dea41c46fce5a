"""brigade-gptq on the real SmolLM2 weights: GPTQ checkpoints made by ``gptq_checkpoint`` (round-to-nearest,
packed as AutoGPTQ packs) run by Brigade in fp32 on the CPU give the greedy tokens HF transformers gives on
the same codes dequantized into an ordinary fp32 checkpoint; the loaded layers hold the packed int32 tensors,
not a dequantized copy; the checkpoint is served end to end through the real server and the openai client;
and what cannot run is refused in one line before anything starts.
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
from gptq_checkpoint import E2E_SPECS
from remote_server import RemoteServer
from quant_model_utils import assert_unloaded_method_names_its_package, hf_greedy, serve_check_refusal
from cli_runner import assert_one_line, run_main

from brigade import LLM, SamplingParams
from brigade_gptq.method import GPTQLinearMethod

BIN = Path(sys.executable).parent
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
MAX_NEW_TOKENS = 16
_BRIGADE_TOKENS: dict = {}  # spec -> greedy token ids per prompt, for the server test


def _prompt_ids(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [tok(p)["input_ids"] for p in PROMPTS]


def test_entry_point_is_discovered_and_registers_gptq():
    proc = subprocess.run([str(BIN / "brigade"), "plugins", "--json"], capture_output=True, text=True,
                          timeout=120, check=True)
    gptq = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}["gptq"]
    assert gptq["distribution"] == "brigade-gptq"
    assert gptq["group"] == "brigade.general_plugins"
    assert gptq["status"] == "loaded", gptq["reason"]
    assert gptq["registered"]["quantization_methods"] == ["gptq"]


@pytest.mark.parametrize("spec", E2E_SPECS, ids=lambda s: s.id)
def test_greedy_tokens_equal_transformers_on_the_dequantized_weights(spec, gptq_checkpoints):
    gptq_dir, ref_dir = gptq_checkpoints(spec)
    prompts = _prompt_ids(gptq_dir)
    want = [tokens for tokens, _ in hf_greedy(ref_dir, prompts, MAX_NEW_TOKENS)]
    shutil.rmtree(ref_dir)  # 0.5 GB of float32; transformers holds its own copy now

    llm = LLM(str(gptq_dir), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.1)  # detected, no flag
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    _BRIGADE_TOKENS[spec] = got
    assert got == want

    # The linear layers hold the checkpoint's packed tensors, and nothing dequantized stays behind.
    model = llm.engine.core.executor.worker.model_runner.model
    pack = 32 // spec.bits
    groups = 1 if spec.group_size == -1 else None
    linears = [m for m in model.modules() if hasattr(m, "quant_method")]
    assert len(linears) == 4 * len(model.model.layers)
    packed_bytes = dense_bytes = 0
    for m in linears:
        assert isinstance(m.quant_method, GPTQLinearMethod) and m.quant_method.gemm is None
        k, n = m.input_size, m.output_size
        assert not hasattr(m, "weight")
        assert {name for name, _ in m.named_parameters()} == {"qweight", "qzeros", "scales", "g_idx"}
        g = groups or -(-k // spec.group_size)
        assert (m.qweight.dtype, tuple(m.qweight.shape)) == (torch.int32, (k // pack, n))
        assert (m.qzeros.dtype, tuple(m.qzeros.shape)) == (torch.int32, (g, n // pack))
        assert (m.scales.dtype, tuple(m.scales.shape)) == (torch.float16, (g, n))
        assert m.g_idx.dtype == torch.int32 and m.g_idx.shape == (k,)  # merged layers' equal rows collapsed
        packed_bytes += sum(p.numel() * p.element_size() for p in m.parameters())
        dense_bytes += k * n * 4
    assert packed_bytes < dense_bytes * (spec.bits / 32) * 1.1  # codes plus < 10% of scales, zeros, g_idx
    assert model.model.embed_tokens.weight.dtype == torch.float32  # embeddings and the head are not GPTQ
    if spec.desc_act:
        assert any(seg.perm is not None for m in linears for seg in m.quant_method.segments)
    del llm, model, linears
    gc.collect()


def test_server_serves_the_gptq_checkpoint(gptq_checkpoints):
    spec = E2E_SPECS[0]
    gptq_dir, _ = gptq_checkpoints(spec)
    if spec not in _BRIGADE_TOKENS:  # this test alone: the offline engine's answer
        llm = LLM(str(gptq_dir), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.1)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
        _BRIGADE_TOKENS[spec] = [o.outputs[0].token_ids
                                 for o in llm.generate(_prompt_ids(gptq_dir), params, use_tqdm=False)]
        del llm
        gc.collect()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gptq_dir))
    srv = RemoteServer(gptq_dir, ["--quantization", "gptq", "--dtype", "float32", "--max-model-len", "256",
                                  "--kv-cache-memory", "0.1", "--served-model-name", "smol-gptq",
                                  "--disable-log-requests"])
    try:
        client = srv.openai_client()
        assert [m.id for m in client.models.list().data] == ["smol-gptq"]
        completion = client.completions.create(model="smol-gptq", prompt=PROMPTS[0], max_tokens=MAX_NEW_TOKENS,
                                               temperature=0.0, extra_body={"ignore_eos": True})
        assert completion.choices[0].text == tok.decode(_BRIGADE_TOKENS[spec][0])
        assert completion.usage.completion_tokens == MAX_NEW_TOKENS
        chat = client.chat.completions.create(model="smol-gptq", max_tokens=8, temperature=0.0,
                                              messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert chat.choices[0].message.content and chat.choices[0].finish_reason in ("length", "stop")
    finally:
        srv.stop()


# ---- refused at start-up, in one line ------------------------------------------------------------------

GPTQ_QC = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


@pytest.mark.parametrize("qc,overrides,needle", [
    ({**GPTQ_QC, "bits": 3}, {}, "GPTQ bits=3 is not supported; brigade-gptq runs GPTQ checkpoints of 4 or 8 bits"),
    ({**GPTQ_QC, "bits": 2}, {}, "GPTQ bits=2 is not supported"),
    ({**GPTQ_QC, "checkpoint_format": "marlin"}, {}, "checkpoint_format 'marlin' is not supported"),
    (GPTQ_QC, {"intermediate_size": 1540},  # gate_up is built first and refuses its out_features
     "GPTQ layer model.layers.0.mlp.gate_up_proj: out_features 1540 (of [1540, 1540]) is not a multiple of 8"),
    (GPTQ_QC, {"hidden_size": 580, "num_attention_heads": 10, "num_key_value_heads": 2, "head_dim": 64},
     "GPTQ layer model.layers.0.self_attn.qkv_proj: in_features 580 is not a multiple of 8"),
    ({**GPTQ_QC, "bits": 8}, {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 6},
     "GPTQ layer model.layers.0.self_attn.qkv_proj: out_features 6 (of [12, 6, 6]) is not a multiple of 4"),
])
def test_unsupported_checkpoints_are_refused_by_serves_checks(smollm2_path, tmp_path, qc, overrides, needle):
    assert needle in serve_check_refusal(smollm2_path, tmp_path / "m", qc, **overrides)


def test_quantization_gptq_on_an_unquantized_checkpoint_is_one_line(smollm2_path):
    proc = run_main("serve", str(smollm2_path), "--quantization", "gptq")
    assert_one_line(proc, "brigade serve", "--quantization gptq needs a GPTQ checkpoint")


def test_a_gptq_checkpoint_without_the_plugin_names_the_package(smollm2_path, tmp_path):
    assert_unloaded_method_names_its_package(smollm2_path, tmp_path / "m", GPTQ_QC, "gptq")
