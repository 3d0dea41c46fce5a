"""Eager mixed steps: the varlen kernel (one launch for every request, GQA heads packed into tile rows, split-KV for
long one-block queries) against what the Triton backend launches today (the split-KV decode kernel and its merge
for the decodes, then the per-head prefill kernel), on the same step.

Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head 128, bf16, block 16, scattered blocks, random
values). Each case is a list of ``(count, query_len, context_len)`` groups, decodes first as the scheduler orders
them; the varlen kernel also with 128-row tiles (32 tokens x 4 heads, 8 warps); times are ``triton.testing.do_bench`` medians in milliseconds (L2 flushed between calls), plus the causal
attention TFLOP/s of the step's prefills for each path.

Usage (CUDA machine, brigade-cuda installed)::

    python benchmarks/kernels/bench_varlen_vs_split.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from brigade_cuda.attention.decode import choose_num_splits, decode_attention
from brigade_cuda.attention.prefill import prefill_attention
from brigade_cuda.attention.varlen import varlen_attention

HEADS, KV_HEADS, HEAD, BLOCK = 32, 8, 128, 16
CASES = {
    "prefill 1 x 4096": [(1, 4096, 0)],
    "prefill 16 x 1024": [(16, 1024, 0)],
    "bench-2-like: 256 decodes @1100 + 8 x 1024 prefill": [(256, 1, 1100), (8, 1024, 0)],
    "64 decodes @2000 + 512 prefill": [(64, 1, 2000), (1, 512, 0)],
    "4 decodes @30000 + 2048 chunk @30000": [(4, 1, 30000), (1, 2048, 30000)],
    "prefill chunk 4096 @12000": [(1, 4096, 12000)],
}


def build(groups: list[tuple[int, int, int]], gen: torch.Generator) -> dict:
    reqs = [(q, c) for count, q, c in groups for _ in range(count)]
    seq_lens = [q + c for q, c in reqs]
    blocks = [-(-s // BLOCK) for s in seq_lens]
    num_blocks = sum(blocks) + 1
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(len(reqs), max(blocks), dtype=torch.int32)
    used = 0
    for r, n in enumerate(blocks):
        table[r, :n] = perm[used:used + n]
        used += n
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor([q for q, _ in reqs]), 0)
    tokens = int(qsl[-1])
    flops = sum(4 * HEADS * HEAD * q * (c + (q + 1) / 2) for q, c in reqs if q > 1)  # QK^T and PV, causal
    return {
        "query": torch.randn(tokens, HEADS, HEAD, device="cuda", dtype=torch.bfloat16),
        "kv": torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD, device="cuda", dtype=torch.bfloat16),
        "table": table.cuda(), "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        "qsl": qsl.cuda(), "num_reqs": len(reqs), "num_decodes": sum(1 for q, _ in reqs if q == 1),
        "max_q": max(q for q, _ in reqs), "max_seq": max(seq_lens), "prefill_flops": flops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator().manual_seed(0)
    scale = HEAD ** -0.5
    rows = []
    for name, groups in CASES.items():
        s = build(groups, gen)
        out_a, out_b = torch.empty_like(s["query"]), torch.empty_like(s["query"])
        d = s["num_decodes"]

        def today():
            if d:
                splits = choose_num_splits(d, KV_HEADS, s["max_seq"], sms)
                decode_attention(s["query"], s["kv"], s["table"], s["seq_lens"], out_a, num_decodes=d,
                                 num_splits=splits, scale=scale)
            if s["num_reqs"] > d:
                prefill_attention(s["query"], s["kv"], s["table"], s["seq_lens"], s["qsl"], out_a, first_req=d,
                                  num_prefills=s["num_reqs"] - d, max_query_len=s["max_q"], scale=scale)

        def varlen(tile=None):
            varlen_attention(s["query"], s["kv"], s["table"], s["seq_lens"], s["qsl"], out_b,
                             num_reqs=s["num_reqs"], scale=scale, tile=tile)

        today()
        varlen()
        torch.cuda.synchronize()
        err = float((out_a.float() - out_b.float()).norm() / out_a.float().norm())
        t_today = triton.testing.do_bench(today)
        t_varlen = triton.testing.do_bench(varlen)
        t_varlen_128 = triton.testing.do_bench(lambda: varlen((128, 64, 8, 2)))
        row = {"case": name, "today_ms": round(t_today, 4), "varlen_ms": round(t_varlen, 4),
               "varlen_128x64_ms": round(t_varlen_128, 4),
               "varlen_over_today": round(t_varlen / t_today, 3), "relative_difference": err}
        if s["prefill_flops"]:
            row["today_prefill_tflops"] = round(s["prefill_flops"] / (t_today * 1e-3) / 1e12, 1)
            row["varlen_prefill_tflops"] = round(s["prefill_flops"] / (t_varlen * 1e-3) / 1e12, 1)
        print(row, flush=True)
        rows.append(row)
        del s
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
