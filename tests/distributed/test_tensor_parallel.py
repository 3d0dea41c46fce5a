"""Tensor parallelism on the mp executor, with real gloo process groups: ``-tp 2`` on a tiny random-weight Llama
whose one KV head is replicated on both ranks gives transformers' greedy tokens (fp32), with workers started by
fork and by spawn; each rank holds half the parameters; dummy weights are the same whatever the layout.

Each check runs in a fresh interpreter (forking pytest's own process, full of threads, could deadlock the child).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

PROMPTS = [[1, 5, 7, 9, 11, 13], [3, 4, 5], [100, 150, 20, 30, 40, 50, 60, 70, 80, 90, 10, 12, 14, 16, 18, 20, 22]]
MAX_TOKENS = 10

_CHECK = r"""
import json, sys
from brigade import LLM, SamplingParams

def generate(llm, prompts):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=int(sys.argv[3]), ignore_eos=True), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]

def main():
    model, prompts, load_format = sys.argv[1], json.loads(sys.argv[2]), sys.argv[4]
    out = {}
    for tp in map(int, sys.argv[5].split(",")):
        # a small step budget and a small pool: prompts are chunked, and requests are preempted
        llm = LLM(model, dtype="float32", max_model_len=32, tensor_parallel_size=tp, skip_tokenizer_init=True,
                  load_format=load_format, max_num_batched_tokens=8, num_gpu_blocks_override=6, block_size=8,
                  enable_prefix_caching=True, async_scheduling=True)
        executor = llm.engine.core.executor
        infos = getattr(executor, "worker_info", [])
        tokens = generate(llm, prompts)
        again = generate(llm, prompts[2:])  # its two full prompt blocks come from the prefix cache
        scheduler = llm.engine.core.scheduler
        out[tp] = {"tokens": tokens, "again": again, "kv": llm.get_kv_cache_stats(),
                   "preemptions": scheduler.num_preemptions_total,
                   "methods": [i.start_method for i in infos], "param_bytes": [i.param_bytes for i in infos],
                   "places": [i.place for i in infos], "pids": [i.pid for i in infos]}
        llm.engine.core.shutdown()
        out[tp]["alive"] = [p.is_alive() for p in getattr(executor, "procs", [])]
    print(json.dumps(out))

if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """4 query heads, 1 KV head (replicated under -tp 2), untied LM head, a vocabulary that -tp 2 pads."""
    config = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny-llama-kv1")
    model.save_pretrained(path)
    refs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 do_sample=False)
            refs.append(out[0, len(prompt):].tolist())
    return path, refs, sum(p.numel() * 4 for p in model.parameters())


def run_check(model, method: str, load_format: str, tps: str) -> dict:
    env = {**os.environ, "BRIGADE_WORKER_MULTIPROC_METHOD": method}
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(model), json.dumps(PROMPTS), str(MAX_TOKENS),
                           load_format, tps], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_tp2_greedy_tokens_match_transformers(tiny_llama, method):
    path, refs, model_bytes = tiny_llama
    got = run_check(path, method, "auto", "2")[2]
    assert got["tokens"] == refs
    assert got["again"] == refs[2:]
    assert got["preemptions"] > 0  # the 6-block pool cannot hold the three requests at once
    assert got["kv"]["num_free_blocks"] == got["kv"]["num_total_blocks"], got["kv"]
    assert got["methods"] == [method, method]
    assert [p.split(":")[0] for p in got["places"]] == ["rank 0/2 (local rank 0, device cpu)",
                                                        "rank 1/2 (local rank 1, device cpu)"]
    assert "tp 0/2" in got["places"][0] and "tp 1/2" in got["places"][1]
    # Each rank holds half of every sharded matrix; the norms (and the replicated KV head) are whole on both.
    for held in got["param_bytes"]:
        assert 0.5 * model_bytes <= held <= 0.6 * model_bytes, (held, model_bytes)
    assert not any(got["alive"]), "workers must exit on shutdown"


def test_dummy_weights_do_not_depend_on_the_layout(tiny_llama):
    """--load-format dummy seeds each parameter by name over its whole shape, then slices: -tp 1 and -tp 2 run
    the same random model."""
    path, _, _ = tiny_llama
    got = run_check(path, "fork", "dummy", "1,2")
    assert got[1]["tokens"] == got[2]["tokens"]
    assert len(set(map(tuple, got[1]["tokens"]))) > 1  # not a degenerate model
