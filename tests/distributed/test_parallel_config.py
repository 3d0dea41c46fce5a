"""Parallel layouts a model or this build cannot take are refused in one line before anything loads."""

from __future__ import annotations

import dataclasses

import pytest
import transformers

from brigade.config import BrigadeConfig, ConfigError, ModelConfig, ParallelConfig
from brigade.engine.core import prepare_config

TINY = dict(vocab_size=200, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=4, architectures=["LlamaForCausalLM"])


def config(model: str = "unused", **parallel) -> BrigadeConfig:
    return BrigadeConfig(model_config=ModelConfig(model=model), parallel_config=ParallelConfig(**parallel))


@pytest.mark.parametrize("tp,hf,expected", [
    (4, {}, "-tp 4 does not divide the model's 6 attention heads; use one of 1, 2, 3, 6"),
    (3, {}, "-tp 3 can neither split nor replicate the model's 4 KV heads evenly"),
    (2, {"intermediate_size": 129}, "-tp 2 does not divide the model's MLP width (intermediate_size 129)"),
])
def test_a_layout_the_model_cannot_take_is_one_line(tp, hf, expected):
    hf_config = transformers.LlamaConfig(**{**TINY, **hf})
    with pytest.raises(ConfigError) as info:
        config(tensor_parallel_size=tp).check_parallel_model(hf_config)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


def test_more_stages_than_layers_is_one_line():
    with pytest.raises(ConfigError, match=r"^-pp 3 is above the model's 2 layers; use -pp 2 or less$"):
        config(pipeline_parallel_size=3).check_parallel_model(transformers.LlamaConfig(**TINY))
    config(pipeline_parallel_size=2).check_parallel_model(transformers.LlamaConfig(**TINY))


def test_the_same_model_takes_a_layout_that_fits():
    for tp in (1, 2):  # 2 splits the 4 KV heads
        config(tensor_parallel_size=tp).check_parallel_model(transformers.LlamaConfig(**TINY))
    replicated = transformers.LlamaConfig(**{**TINY, "num_key_value_heads": 2, "intermediate_size": 132})
    config(tensor_parallel_size=6).check_parallel_model(replicated)  # each KV head on 3 ranks


@pytest.mark.parametrize("extra,expected", [
    ({"kv": True}, "--kv-transfer-config (a KV connector) with tensor parallelism (-tp 2) is not supported yet"),
    ({"backend": "uni"}, "--distributed-executor-backend uni runs one worker, but -tp 2 -pp 1 needs 2"),
    ({"pp": 2, "kv": True}, "--kv-transfer-config (a KV connector) with pipeline parallelism (-pp 2) is not "
                            "supported yet"),
])
def test_combinations_this_build_cannot_run_are_one_line(extra, expected):
    from brigade.config import KVTransferConfig, LoRAConfig

    from brigade.config.speculative import SpeculativeConfig

    pp = extra.get("pp", 1)
    c = config(tensor_parallel_size=1 if pp > 1 else 2, pipeline_parallel_size=pp,
               distributed_executor_backend=extra.get("backend"))
    if extra.get("spec"):
        c.speculative_config = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    c.model_config.quantization = extra.get("quantization")
    if extra.get("lora"):
        c.lora_config = LoRAConfig()
    if extra.get("kv"):
        c.kv_transfer_config = KVTransferConfig(kv_connector="shm", kv_role="kv_both")
    with pytest.raises(ConfigError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        c.check_supported()


def test_lora_quantization_and_speculation_pass_the_checks_under_tp():
    """They run under -tp 2 (test_lora_under_tp.py, test_quantization_under_tp.py, test_fp8_under_tp.py,
    test_spec_and_grammar_under_tp.py); only the model build may still refuse a quantized layer that cannot be
    split. LoRA and speculative decoding also run under -pp 2."""
    from brigade.config import LoRAConfig
    from brigade.config.speculative import SpeculativeConfig

    c = config(tensor_parallel_size=2)
    c.lora_config, c.model_config.quantization = LoRAConfig(), "fp8"
    c.speculative_config = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    c.check_supported()
    staged = config(pipeline_parallel_size=2)
    staged.lora_config = LoRAConfig()
    staged.speculative_config = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    staged.check_supported()
    quantized = transformers.LlamaConfig(**TINY, quantization_config={"quant_method": "gptq", "bits": 4})
    c.check_parallel_model(quantized)


def test_smollm2_heads_are_checked_when_the_config_is_prepared(smollm2_path):
    with pytest.raises(ConfigError, match=r"^-tp 2 does not divide the model's 9 attention heads; use one of 1, 3, 9$"):
        prepare_config(config(str(smollm2_path), tensor_parallel_size=2))
    prepare_config(config(str(smollm2_path), tensor_parallel_size=3))  # 9 heads, 3 KV heads: one each


def test_more_workers_than_visible_gpus_is_one_line(monkeypatch):
    """Checked from CUDA_VISIBLE_DEVICES alone (NVML otherwise), without touching the CUDA driver."""
    from brigade_cuda.platform import CudaPlatform

    from brigade.engine.placement import check_device_count

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    c = config(tensor_parallel_size=4)
    with pytest.raises(ConfigError, match=r"^-dp 1 x -tp 4 x -pp 1 needs 4 cuda devices but 2 are visible "
                                          r"\(CUDA_VISIBLE_DEVICES=0,1\); lower the sizes"):
        check_device_count(c, CudaPlatform)
    check_device_count(dataclasses.replace(c, parallel_config=ParallelConfig(tensor_parallel_size=2)), CudaPlatform)


def test_serve_with_more_stages_than_layers_exits_with_one_line(smollm2_path):
    """The command itself: one stderr line, exit status 2, before any weight is read."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints"))
    from cli_runner import assert_one_line, run_cli

    proc = run_cli("serve", str(smollm2_path), "-pp", "31")
    assert_one_line(proc, "brigade serve", "-pp 31 is above the model's 30 layers; use -pp 30 or less")
