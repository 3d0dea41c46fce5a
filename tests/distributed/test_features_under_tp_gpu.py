"""LoRA, GPTQ and FP8 under ``-tp 2`` on two GPUs (NCCL, CUDA graphs, the Triton and FP8 kernels on each rank's
slices): LoRA gives transformers' greedy tokens with the delta merged (fp32); GPTQ gives ``-tp 1``'s tokens, which
give transformers' on the dequantized weights; online FP8 stays as close to the dense model as ``-tp 1``. Runs where
CUDA shows two devices (the CPU forms: test_lora_under_tp.py, test_quantization_under_tp.py, test_fp8_under_tp.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers
from parallel_check import MAX_TOKENS, PROMPTS, hf_greedy_tokens, hf_prompt_logprobs, run_check

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lora"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "quant"))
from gptq_checkpoint import GPTQSpec, quantize_model as quantize_gptq  # noqa: E402
from gptq_checkpoint import write_dequantized_checkpoint, write_gptq_checkpoint  # noqa: E402
from lora_utils import ALL_MODULES, merged_lora, write_adapter  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")
GPU_ARGS = dict(block_size=16, max_model_len=64, num_gpu_blocks_override=32, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def gpu_llama(tmp_path_factory):
    """64-wide heads (what the Triton backend takes), 4 query heads, 2 KV heads (one per rank), widths that
    AutoGPTQ's packer and the FP8 tensor cores take (multiples of 32)."""
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpu-llama-kv2")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_lora_tp2_on_two_gpus_matches_merged_transformers(gpu_llama, tmp_path):
    config = transformers.AutoConfig.from_pretrained(gpu_llama)
    adapter = write_adapter(tmp_path / "adapter", config, seed=3, rank=8, alpha=16, targets=ALL_MODULES, std=0.15)
    model = transformers.AutoModelForCausalLM.from_pretrained(gpu_llama, dtype=torch.float32).eval()
    with merged_lora(model, adapter), torch.inference_mode():
        refs = [model.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                               do_sample=False)[0, len(p):].tolist() for p in PROMPTS]
    got = run_check(gpu_llama, "spawn", "auto", "2x1", request={"lora": str(adapter)}, enable_lora=True,
                    max_lora_rank=8, **GPU_ARGS)["2x1"]
    assert got["tokens"] == refs and got["again"] == refs[2:]


def test_gptq_tp2_on_two_gpus_matches_tp1(gpu_llama, tmp_path):
    spec = GPTQSpec(bits=4, group_size=64, desc_act=False, sym=False)
    layers = quantize_gptq(gpu_llama, spec)
    gptq = write_gptq_checkpoint(gpu_llama, tmp_path / "gptq", spec, layers=layers)
    refs = hf_greedy_tokens(write_dequantized_checkpoint(gpu_llama, tmp_path / "reference", layers))
    got = run_check(gptq, "spawn", "auto", "1x1,2x1", **GPU_ARGS)
    assert got["1x1"]["tokens"] == refs and got["2x1"]["tokens"] == refs


def test_online_fp8_tp2_on_two_gpus_is_close_to_tp1(gpu_llama):
    got = run_check(gpu_llama, "spawn", "auto", "1x1,2x1", request={"prompt_logprobs": True}, quantization="fp8",
                    **GPU_ARGS)
    base = hf_prompt_logprobs(gpu_llama)

    def gap(a, b):
        return max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p, q))

    one, two = got["1x1"]["prompt_logprobs"], got["2x1"]["prompt_logprobs"]
    assert 0 < gap(one, base) < 0.1 and gap(two, base) < 0.1 and gap(one, two) < 0.1, \
        (gap(one, base), gap(two, base), gap(one, two))
