"""FP8 under tensor parallelism (mp executor, real gloo groups): a compressed-tensors FP8 checkpoint (static
per-tensor weight and input scales, made with the compressed-tensors library as llm-compressor makes it) gives the
same greedy tokens under ``-tp 2`` and ``-pp 2`` as under ``-tp 1``, each rank loading its slice of the FP8 weights
with the scales replicated, and so does a ``quant_method: fp8`` checkpoint of 32x32 blocks (a split that would cut
a block is refused in one line); online ``--quantization fp8`` and compressed-tensors ``FP8_DYNAMIC`` (dynamic
per-token activations) stay as close to the dense model under ``-tp 2`` as under ``-tp 1``. FP8 runs as an fp32 emulation on the CPU
(``brigade_fp8.gemm``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers
from parallel_check import PROMPTS, check_parallel_matches_one_rank, hf_prompt_logprobs, run_check

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "quant"))
from fp8_checkpoint import compressed_tensors_checkpoint, fp8_checkpoint  # noqa: E402

from brigade import LLM
from brigade.config import ConfigError


def test_compressed_tensors_fp8_tp2_and_pp2_match_tp1(quant_llama, tmp_path):
    """Static per-tensor scales (replicated on both ranks) and a static input scale: exact under the split."""
    model = transformers.AutoModelForCausalLM.from_pretrained(quant_llama, dtype=torch.float32).eval()
    out = compressed_tensors_checkpoint(model, tmp_path / "fp8", "FP8", [p for p in PROMPTS])
    check_parallel_matches_one_rank(out)


@pytest.mark.parametrize("scheme", ["online", "FP8_DYNAMIC"])
def test_dynamic_fp8_tp2_is_close_to_tp1(quant_llama, tmp_path, scheme):
    """Dynamic FP8 quantizes each token's activations per rank, as vLLM does, and online FP8 also each rank's
    weight slice as loaded: a row-parallel rank's per-token activation scales (and online per-channel weight scales)
    are taken over its own input columns, so -tp 2 rounds differently from -tp 1 (finer, not worse), and this
    random model's nearly flat logits let that flip greedy tokens. So the prompt tokens' logprobs are compared
    instead, against the unquantized model's too: -tp 2 is as close to it as -tp 1 is. ``FP8_DYNAMIC`` is
    compressed-tensors' per-channel checkpoint: each rank keeps the channel scales of its output rows."""
    if scheme == "online":
        path, args = quant_llama, {"quantization": "fp8"}
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(quant_llama, dtype=torch.float32).eval()
        path, args = compressed_tensors_checkpoint(model, tmp_path / "fp8", scheme, []), {}
    got = run_check(path, "fork", "auto", "1x1,2x1", request={"prompt_logprobs": True}, **args)
    base = hf_prompt_logprobs(quant_llama)

    def gap(a, b):
        return max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p, q))

    one, two = got["1x1"]["prompt_logprobs"], got["2x1"]["prompt_logprobs"]
    # quantized (not the dense model), and -tp 2 as close to the dense model as -tp 1 (about 0.05 here)
    assert 0 < gap(one, base) < 0.1 and gap(two, base) < 0.1 and gap(one, two) < 0.1, \
        (gap(one, base), gap(two, base), gap(one, two))


def test_block_fp8_tp2_and_pp2_match_tp1(quant_llama, tmp_path):
    """``quant_method: fp8`` with 32x32 weight blocks: each rank keeps the block scales of its rows (column-parallel)
    or columns (row-parallel); activations are quantized per 1x32 group, which the split keeps whole: exact."""
    model = transformers.AutoModelForCausalLM.from_pretrained(quant_llama, dtype=torch.float32).eval()
    out, _ = fp8_checkpoint(model, tmp_path / "fp8", tmp_path / "reference", block=(32, 32))
    check_parallel_matches_one_rank(out)


def test_a_block_the_split_would_cut_is_one_line(quant_llama, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(quant_llama, dtype=torch.float32).eval()
    out, _ = fp8_checkpoint(model, tmp_path / "fp8", tmp_path / "reference", block=(64, 64))
    with pytest.raises(ConfigError) as info:
        LLM(str(out), tensor_parallel_size=2, dtype="float32", skip_tokenizer_init=True)
    message = str(info.value)
    assert message.startswith("FP8 layer model.layers.0.self_attn.qkv_proj: block-scaled shards of out_features "
                              "[64, 32, 32] (this rank's slices under -tp 2) are not multiples of the weight block's "
                              "64 rows") and "\n" not in message, message
