"""Where the device time of a throughput run goes, kernel by kernel (bench 2: prefill-heavy, 1024 in / 128 out).

Runs ``--num-prompts`` random prompts of ``--input-len`` tokens, each generating ``--output-len`` (ignore_eos,
temperature 1.0, bench 2's engine settings), once untimed to warm up and once under ``torch.profiler``. Reports:

* the wall time, the device's busy time (the union of all kernel intervals) and so its idle share: a large idle
  share means the host, not the device, sets the pace;
* the kernel time per category (projection GEMMs, attention, norms, rotary/KV write, SiLU-and-mul, sampler,
  LM head, copies, other) with each one's share, plus the ten longest kernels by name;
* the GEMMs' achieved TFLOP/s: 2 × (the model's non-embedding weights) FLOPs per scheduled token, over the GEMM
  kernel time (the LM head is counted apart: it runs on sampled rows only).

Usage (CUDA machine, Brigade and brigade-cuda installed)::

    python benchmarks/profile_throughput_kernels.py benchmarks/configs/llama-3.1-8b --num-prompts 200 --json out.json \
        [--quantization fp8] [--kv-cache-dtype fp8]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from brigade import LLM
from brigade.benchmarks.datasets import random_requests
from brigade.benchmarks.throughput import bench_sampling_params
from profile_decode_step import _union as busy_time  # the length of a union of [start, end) intervals (µs)

# (category, substrings of the kernel name), first match wins; matched on the lowercased name.
CATEGORIES = (
    ("sampler", ("sample", "philox", "gumbel", "argmax", "topk", "top_k", "softmax")),
    ("attention", ("attn", "attention", "attend", "decode_split", "merge", "varlen", "prefill")),
    ("rotary_kv_write", ("rotary", "rope", "kv_write", "reshape_and_cache")),
    ("norm", ("rms", "norm")),
    ("silu_and_mul", ("silu", "act_and_mul")),
    ("gemm", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "matmul", "_mm_", "sm90", "cublas", "skinny")),
    ("fp8_quant", ("per_token_quant", "quant_kernel")),
    ("copy", ("memcpy", "memset", "copy", "fill", "cat", "index")),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--max-num-seqs", type=int, default=512)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quantization", help="as brigade's flag, e.g. fp8 (online FP8 of the dummy weights)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="as brigade's flag: auto or fp8")
    args = parser.parse_args()
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
              max_model_len=args.input_len + args.output_len + 16, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, quantization=args.quantization,
              kv_cache_dtype=args.kv_cache_dtype)
    cfg = llm.engine.core.executor.hf_config
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    model = llm.engine.core.executor.worker.model_runner.model
    params_total = sum(p.numel() for p in model.parameters())
    embed_params = vocab * hidden * (1 if cfg.tie_word_embeddings else 2)
    body_params = params_total - embed_params

    cuda = torch.cuda.is_available()  # without CUDA (a smoke run of this script), CPU ops stand in for kernels
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def run(seed: int):
        reqs = random_requests(args.num_prompts, args.input_len, args.output_len, vocab_size=vocab, seed=seed)
        llm.reset_prefix_cache()
        sync()
        t = time.perf_counter()
        llm.generate([r.prompt_token_ids for r in reqs], [bench_sampling_params(r.output_len) for r in reqs],
                     use_tqdm=False)
        sync()
        return time.perf_counter() - t

    unprofiled = run(1)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        wall = run(2)
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernels = [e for e in prof.events() if e.device_type == kind]
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy_us = busy_time(intervals)
    per_cat: dict[str, float] = defaultdict(float)
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        d = e.time_range.end - e.time_range.start
        per_cat[category(e.name)] += d
        per_name[e.name][0] += 1
        per_name[e.name][1] += d
    kernel_us = sum(per_cat.values())
    tokens = args.num_prompts * (args.input_len + args.output_len - 1)
    gemm_flops = 2.0 * body_params * tokens
    rec = {
        "command": vars(args), "device": torch.cuda.get_device_name() if cuda else "cpu",
        "wall_s_unprofiled": round(unprofiled, 3), "wall_s_profiled": round(wall, 3),
        "total_tok_per_s_unprofiled": round(args.num_prompts * (args.input_len + args.output_len) / unprofiled),
        "device_busy_s": round(busy_us / 1e6, 3), "device_idle_share": round(1 - busy_us / 1e6 / wall, 4),
        "kernel_s": round(kernel_us / 1e6, 3), "kernels": len(kernels),
        "categories": {k: {"s": round(v / 1e6, 3), "share": round(v / kernel_us, 4)}
                       for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])},
        "gemm_tflops_achieved": round(gemm_flops / (per_cat["gemm"] / 1e6) / 1e12, 1) if per_cat["gemm"] else None,
        "body_params": body_params,
        "top_kernels": [{"name": n[:120], "calls": int(c), "s": round(t / 1e6, 3), "category": category(n)}
                        for n, (c, t) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:12]],
    }
    print(json.dumps(rec, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
