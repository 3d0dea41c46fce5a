"""GPTQ and AWQ checkpoints under tensor parallelism (mp executor, real gloo groups): each rank loads only its
slice of the packed tensors (``qweight``/``qzeros``/``scales``/``g_idx``), and ``-tp 2`` gives the same greedy
tokens as ``-tp 1`` (fp32 on the CPU), which give transformers' on the dequantized weights. The checkpoints are made
from a tiny random Llama with the writers of tests/quant (AutoGPTQ's and AutoAWQ's packing). A split that cuts a
quantization group, and act-order GPTQ, are refused in one line before any worker starts. FP8: test_fp8_under_tp.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from parallel_check import check_parallel_matches_one_rank, hf_greedy_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "quant"))
from awq_checkpoint import quantize_model as quantize_awq, write_awq_checkpoint  # noqa: E402
from gptq_checkpoint import GPTQSpec, quantize_model as quantize_gptq  # noqa: E402
from gptq_checkpoint import write_dequantized_checkpoint, write_gptq_checkpoint  # noqa: E402

from brigade import LLM
from brigade.config import ConfigError


# Group 32 divides each rank's rows: o_proj 128 / 2 = 64, down_proj 192 / 2 = 96.
@pytest.mark.parametrize("spec", [GPTQSpec(bits=4, group_size=32, desc_act=False, sym=False),
                                  GPTQSpec(bits=8, group_size=-1, desc_act=False, sym=True)], ids=lambda s: s.id)
def test_gptq_tp2_and_pp2_match_tp1_and_transformers(quant_llama, tmp_path, spec):
    path = quant_llama
    layers = quantize_gptq(path, spec)
    gptq = write_gptq_checkpoint(path, tmp_path / "gptq", spec, layers=layers)
    refs = hf_greedy_tokens(write_dequantized_checkpoint(path, tmp_path / "reference", layers))
    check_parallel_matches_one_rank(gptq, refs)


def test_awq_tp2_and_pp2_match_tp1_and_transformers(quant_llama, tmp_path):
    path = quant_llama
    layers = quantize_awq(path, 32)
    awq = write_awq_checkpoint(path, tmp_path / "awq", 32, layers)
    refs = hf_greedy_tokens(write_dequantized_checkpoint(path, tmp_path / "reference", layers))
    check_parallel_matches_one_rank(awq, refs)


@pytest.mark.parametrize("spec,expected", [
    (GPTQSpec(bits=4, group_size=64, desc_act=False, sym=True),
     "GPTQ layer model.layers.0.mlp.down_proj: -tp 2 splits its 192 input rows into 96 per rank, which group_size 64 "
     "does not divide"),
    (GPTQSpec(bits=4, group_size=32, desc_act=True, sym=True),
     "GPTQ layer model.layers.0.self_attn.o_proj: an act-order checkpoint (desc_act true) cannot run with tensor "
     "parallelism (-tp 2)"),
], ids=["group-cut", "act-order"])
def test_a_split_the_checkpoint_cannot_take_is_one_line(quant_llama, tmp_path, spec, expected):
    gptq = write_gptq_checkpoint(quant_llama, tmp_path / "gptq", spec)
    with pytest.raises(ConfigError) as info:
        LLM(str(gptq), tensor_parallel_size=2, dtype="float32", skip_tokenizer_init=True)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value), str(info.value)


def test_an_awq_group_the_split_would_cut_is_one_line(quant_llama, tmp_path):
    awq = write_awq_checkpoint(quant_llama, tmp_path / "awq", 64, quantize_awq(quant_llama, 64))
    with pytest.raises(ConfigError) as info:
        LLM(str(awq), tensor_parallel_size=2, dtype="float32", skip_tokenizer_init=True)
    message = str(info.value)
    assert message.startswith("AWQ layer model.layers.0.mlp.down_proj: -tp 2 splits its 192 input rows into 96 per "
                              "rank, which group_size 64 does not divide") and "\n" not in message, message
