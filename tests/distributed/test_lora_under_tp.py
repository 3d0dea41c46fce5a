"""LoRA under tensor parallelism (mp executor, real gloo groups): with an adapter on every projection of a tiny
random Llama whose one KV head is replicated on both ranks, ``-tp 2`` gives the same greedy tokens as ``-tp 1``
and as transformers on the weights with the delta merged in (fp32), with chunked prefill, preemption and the
prefix cache keyed by the adapter. The adapters are sharded as vLLM shards them (``brigade.lora.layers``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers
from parallel_check import MAX_TOKENS, PROMPTS, run_check

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lora"))
from lora_utils import ALL_MODULES, merged_lora, write_adapter  # noqa: E402


def test_tp2_lora_tokens_match_tp1_and_merged_transformers(tiny_llama, tmp_path):
    path, base_refs, _ = tiny_llama
    config = transformers.AutoConfig.from_pretrained(path)
    adapter = write_adapter(tmp_path / "adapter", config, seed=3, rank=8, alpha=16, targets=ALL_MODULES, std=0.15)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    refs = []
    with merged_lora(model, adapter), torch.inference_mode():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 do_sample=False)
            refs.append(out[0, len(prompt):].tolist())
    assert refs != base_refs  # the adapter changes the output: the test sees whether it is applied

    got = run_check(path, "fork", "auto", "1x1,2x1,1x2", request={"lora": str(adapter)}, enable_lora=True,
                    max_lora_rank=8)
    for layout in ("1x1", "2x1", "1x2"):
        assert got[layout]["tokens"] == refs, layout
        assert got[layout]["again"] == refs[2:], layout
        assert got[layout]["preemptions"] > 0, layout
        assert got[layout]["kv"]["num_free_blocks"] == got[layout]["kv"]["num_total_blocks"]
