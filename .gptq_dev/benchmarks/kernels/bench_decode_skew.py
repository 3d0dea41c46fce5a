"""Split-KV decode attention on long-tailed context lengths: does one split per request lose to the longest
request at large batches?

At 33+ decode requests (Llama-3.1-8B heads: 8 KV heads) ``choose_num_splits`` gives one split per
``(request, kv head)``, so one program walks a request's whole context. With bench 3's ShareGPT-like
lengths (median prompt ~130 tokens, longest 1024) the longest program may outlast the kernel's fair
share of HBM time. This times, graph-replayed as the model runs it (``bench_attention.graph_time_ms``), the
decode over the first ``B`` ShareGPT-like contexts for split counts 1-8, next to the same total context
spread evenly over the batch (the balanced reference) and the copy-bandwidth floor.

Usage (CUDA machine, from the repository root)::

    PYTHONPATH=core:builtin_platforms/cuda:benchmarks/kernels python benchmarks/kernels/bench_decode_skew.py --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
from bench_attention import (BLOCK_SIZE, DTYPE, HEAD_SIZE, NUM_HEADS, NUM_KV_HEADS, copy_bandwidth,
                             decode_call, graph_time_ms)

from brigade.benchmarks.datasets import sharegpt_like_requests


def case_for(contexts: list[int]) -> dict:
    """A decode batch with these context lengths, pages shuffled over the pool, random K/V everywhere."""
    batch = len(contexts)
    width = max(triton.cdiv(c, BLOCK_SIZE) for c in contexts)
    num_blocks = sum(triton.cdiv(c, BLOCK_SIZE) for c in contexts) + 8
    perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    block_table = torch.zeros((batch, width), dtype=torch.int32, device="cuda")
    used = 0
    for i, c in enumerate(contexts):
        n = triton.cdiv(c, BLOCK_SIZE)
        block_table[i, :n] = perm[used:used + n]
        used += n
    kv_cache = torch.randn((2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE), device="cuda", dtype=DTYPE)
    seq_lens = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    query = torch.randn((batch, NUM_HEADS, HEAD_SIZE), device="cuda", dtype=DTYPE)
    kv_bytes = 2 * sum(contexts) * NUM_KV_HEADS * HEAD_SIZE * kv_cache.element_size()
    return dict(block_table=block_table, kv_cache=kv_cache, seq_lens=seq_lens, query=query, kv_bytes=kv_bytes)


def time_contexts(contexts: list[int], num_splits: int, copies: int) -> float:
    """Median ms of one decode call over these contexts (``copies`` distinct caches per replay, past L2)."""
    cases = [case_for(contexts) for _ in range(copies)]
    out = torch.empty_like(cases[0]["query"])
    ms = graph_time_ms([decode_call(c, out, num_splits) for c in cases])
    del cases
    torch.cuda.empty_cache()
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="48,96,128")
    parser.add_argument("--splits", default="1,2,3,4,6,8")
    parser.add_argument("--progress", type=int, default=32, help="tokens generated so far, added to each prompt")
    parser.add_argument("--json")
    args = parser.parse_args()
    bw = copy_bandwidth()
    reqs = sharegpt_like_requests(max(int(b) for b in args.batches.split(",")), vocab_size=128256,
                                  max_model_len=4096)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        skewed = [len(r.prompt_token_ids) + args.progress for r in reqs[:batch]]
        even = [sum(skewed) // batch] * batch
        kv_bytes = 2 * sum(skewed) * NUM_KV_HEADS * HEAD_SIZE * 2
        copies = max(4, min(32, (256 << 20) // kv_bytes + 1))
        row = {"batch": batch, "max_context": max(skewed), "mean_context": sum(skewed) / batch,
               "floor_us": 1e6 * kv_bytes / bw, "skewed_us": {}, "even_us": {}}
        for s in (int(x) for x in args.splits.split(",")):
            row["skewed_us"][s] = round(1e3 * time_contexts(skewed, s, copies), 2)
            row["even_us"][s] = round(1e3 * time_contexts(even, s, copies), 2)
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth_GBps": bw / 1e9, "progress": args.progress, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
