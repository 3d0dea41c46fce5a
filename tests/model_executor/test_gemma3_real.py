"""The real Gemma 3 270M (18 layers, 5 sliding-window layers of 512 tokens to 1 global, local and global rope bases,
q/k norms, a tied 262k-token embedding), dequantized from its Q4_K_M GGUF by ``scripts/fetch_model.py --model
gemma-3-270m`` on first use and cached: a prompt past the window gives Brigade's greedy tokens equal to
transformers' on the same files (fp32, CPU). Kept cheap: one prompt, four tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers

from brigade import LLM, SamplingParams

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
MAX_NEW_TOKENS = 4
TEXT = ("The kitchen brigade was organised by Auguste Escoffier: the chef de cuisine leads, the sous-chef runs the "
        "line, and each station cook owns one part of every plate, from sauces to pastry. ")


@pytest.fixture(scope="module")
def gemma3_path() -> Path:
    """The converted model directory, built (about two minutes, once per cache) when absent."""
    spec = importlib.util.spec_from_file_location("brigade_fetch_model", REPO_ROOT / "scripts" / "fetch_model.py")
    fetch_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_model)
    return fetch_model.fetch_gemma3()


def test_greedy_tokens_equal_transformers_past_the_sliding_window(gemma3_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gemma3_path))
    prompt = tokenizer(TEXT * 16)["input_ids"][:600]
    assert transformers.AutoConfig.from_pretrained(str(gemma3_path)).sliding_window < len(prompt)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(gemma3_path), dtype=torch.float32,
                                                                 attn_implementation="eager").eval()
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                min_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    expected = out[0, len(prompt):].tolist()
    del hf_model, out

    # 288 blocks: its 18 layers form 6 KV cache groups of 3 (one full, five sliding) sharing 3 KV tensors, so this is
    # the memory of 48 blocks of every layer; a request of 640 tokens holds up to 240 of them.
    llm = LLM(str(gemma3_path), dtype="float32", max_model_len=640, block_size=16, num_gpu_blocks_override=288,
              skip_tokenizer_init=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids
    assert list(got) == expected, (tokenizer.decode(got), tokenizer.decode(expected))
