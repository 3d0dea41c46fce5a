"""Microbenchmark of the Triton paged decode attention: achieved HBM bandwidth against the copy bandwidth
measured in the same run (Llama-3.1-8B attention shape: 32 query heads, 8 KV heads, head 128, bf16).

Decode attention reads every context token's K and V once, so its floor is
``bytes(K) + bytes(V)`` over the copy bandwidth; the reported ratio is achieved / copy bandwidth.

Two timings per case:
  * ``graph``: the kernel time. One CUDA graph runs the decode over enough distinct KV caches (each
    used once per replay, at least 256 MB in all) that the 60 MB L2 never serves them; replay time
    divided by the number of caches, median of 30 replays. This is how a graph-captured decode step
    runs.
  * ``eager``: ``triton.testing.do_bench`` median of single eager calls (L2 flushed before each). For
    small cases this is bound by the host's kernel-launch cost, reported separately as ``host_us``.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=core:builtin_platforms/cuda python benchmarks/kernels/bench_attention.py [--json PATH] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from brigade.attention.backend import AttentionMetadata
from brigade_cuda.attention import TritonAttentionBackend, choose_num_splits, decode_attention
from brigade_cuda.attention.prefill import prefill_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE, DTYPE = 32, 8, 128, 16, torch.bfloat16
BATCHES, CONTEXTS = (1, 32, 256), (1024, 4096)


def copy_bandwidth(num_bytes: int = 4 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.randn(num_bytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def decode_case(batch: int, context: int) -> dict:
    """Random paged decode batch: every request has ``context`` tokens (this step's one included)."""
    blocks_per_req = triton.cdiv(context, BLOCK_SIZE)
    num_blocks = batch * blocks_per_req
    # Shuffled physical blocks: a request's pages are scattered, as after a while of serving.
    block_table = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, blocks_per_req)
    kv_cache = torch.randn((2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE), device="cuda", dtype=DTYPE)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    query = torch.randn((batch, NUM_HEADS, HEAD_SIZE), device="cuda", dtype=DTYPE)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_SIZE * kv_cache.element_size()
    return dict(block_table=block_table, kv_cache=kv_cache, seq_lens=seq_lens, query=query, kv_bytes=kv_bytes)


def graph_time_ms(calls: list, replays: int = 30) -> float:
    """Median time of one call when ``calls`` (zero-argument callables) are replayed as one CUDA graph."""
    for call in calls:
        call()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times) / len(calls)


def rotated_cases(batch: int, context: int, min_bytes: int = 256 << 20) -> list[dict]:
    """Enough independent decode cases that their KV caches together exceed ``min_bytes`` (L2 is 60 MB)."""
    first = decode_case(batch, context)
    count = max(1, min(64, -(-min_bytes // first["kv_bytes"])))
    return [first] + [decode_case(batch, context) for _ in range(count - 1)]


def decode_call(case: dict, out: torch.Tensor, num_splits: int, **tile):
    return lambda: decode_attention(case["query"], case["kv_cache"], case["block_table"], case["seq_lens"], out,
                                    num_decodes=case["query"].shape[0], num_splits=num_splits,
                                    scale=HEAD_SIZE ** -0.5, **tile)


def bench_decode_graph(cases: list[dict], num_splits: int, **tile) -> float:
    out = torch.empty_like(cases[0]["query"])
    return graph_time_ms([decode_call(case, out, num_splits, **tile) for case in cases])


def host_overhead_us(call, repeats: int = 300) -> float:
    """Host time per eager call (launch cost): the GPU work is queued, never waited for, in the loop."""
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        call()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / repeats * 1e6


def bench_decode(case: dict, num_splits: int, rep_ms: int = 200, **tile) -> float:
    out = torch.empty_like(case["query"])
    fn = lambda: decode_attention(case["query"], case["kv_cache"], case["block_table"], case["seq_lens"],  # noqa: E731
                                  out, num_decodes=case["query"].shape[0], num_splits=num_splits,
                                  scale=HEAD_SIZE ** -0.5, **tile)
    return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def bench_backend_forward(case: dict, batch: int, context: int) -> float:
    """The whole backend decode step (KV write + split kernel + merge), as the model runs it."""
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    slots = (case["block_table"][:, -1].long() * BLOCK_SIZE + (context - 1) % BLOCK_SIZE)
    md = AttentionMetadata(num_reqs=batch, num_actual_tokens=batch, max_query_len=1, max_seq_len=context,
                           num_decodes=batch, query_start_loc=qsl.cuda(), seq_lens=case["seq_lens"],
                           block_table=case["block_table"], slot_mapping=slots, query_start_loc_cpu=qsl,
                           seq_lens_cpu=case["seq_lens"].cpu())
    kv = torch.randn((batch, NUM_KV_HEADS, HEAD_SIZE), device="cuda", dtype=DTYPE)
    backend = TritonAttentionBackend(NUM_HEADS, HEAD_SIZE, NUM_KV_HEADS, HEAD_SIZE ** -0.5)
    return do_bench(lambda: backend.forward(case["query"], kv, kv, case["kv_cache"], md), warmup=25, rep=200,
                    return_mode="median")


def bench_sdpa_peer(batch: int, context: int) -> float:
    """PyTorch SDPA on contiguous (unpaged) K/V of the same shape: a peer, not a paged kernel."""
    q = torch.randn((batch, NUM_HEADS, 1, HEAD_SIZE), device="cuda", dtype=DTYPE)
    k = torch.randn((batch, NUM_KV_HEADS, context, HEAD_SIZE), device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    return do_bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), warmup=25, rep=200,
                    return_mode="median")


def bench_prefill(query_len: int, tile: tuple[int, int, int, int] | None = None) -> dict:
    """One causal prefill of ``query_len`` tokens, no prefix: achieved TFLOP/s (4 * q * k / 2 * D * H)."""
    blocks = triton.cdiv(query_len, BLOCK_SIZE)
    kv_cache = torch.randn((2, blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE), device="cuda", dtype=DTYPE)
    block_table = torch.randperm(blocks, device="cuda").to(torch.int32)[None]
    q = torch.randn((query_len, NUM_HEADS, HEAD_SIZE), device="cuda", dtype=DTYPE)
    out = torch.empty_like(q)
    qsl = torch.tensor([0, query_len], dtype=torch.int32, device="cuda")
    seq = torch.tensor([query_len], dtype=torch.int32, device="cuda")
    ms = do_bench(lambda: prefill_attention(q, kv_cache, block_table, seq, qsl, out, first_req=0, num_prefills=1,
                                            max_query_len=query_len, scale=HEAD_SIZE ** -0.5, tile=tile),
                  warmup=25, rep=200, return_mode="median")
    flops = 4 * query_len * query_len / 2 * HEAD_SIZE * NUM_HEADS
    return {"query_len": query_len, "tile": tile, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}


SHORT_CONFIGS = ((64, 4, 3), (64, 4, 2), (128, 4, 2), (128, 8, 2), (32, 4, 3), (64, 8, 3))


def short_context_sweep(num_sms: int) -> list[dict]:
    """Batch 1 and 4 at short contexts: the split-KV default (split kernel + merge) against one split (no
    merge) over a few tiles, graph-replayed with PDL as in a decode graph; per call in microseconds."""
    rows = []
    for batch in (1, 4):
        for context in (128, 256, 384, 512, 1024):
            cases = rotated_cases(batch, context, min_bytes=64 << 20)
            splits = choose_num_splits(batch, NUM_KV_HEADS, 2048, num_sms)  # what a max_model_len graph uses
            row = {"batch": batch, "context": context, "default_splits": splits,
                   "default_us": bench_decode_graph(cases, splits) * 1e3}
            for block_n, warps, stages in SHORT_CONFIGS:
                row[f"s1-n{block_n}-w{warps}-st{stages}_us"] = bench_decode_graph(
                    cases, 1, block_n=block_n, num_warps=warps, num_stages=stages) * 1e3
            for s in (2, 4):
                row[f"s{s}_us"] = bench_decode_graph(cases, s) * 1e3
            rows.append(row)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()})
            del cases
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--sweep", action="store_true", help="also sweep split counts and tile configs")
    parser.add_argument("--short-only", action="store_true",
                        help="only the short-context sweep (one split against split-KV, batch 1 and 4)")
    args = parser.parse_args()
    if args.short_only:
        rows = short_context_sweep(torch.cuda.get_device_properties(0).multi_processor_count)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "short_context": rows}, f, indent=1)
        return
    props = torch.cuda.get_device_properties(0)
    results: dict = {"device": props.name, "num_sms": props.multi_processor_count, "torch": torch.__version__,
                     "triton": triton.__version__, "python": platform.python_version(),
                     "shape": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_size": HEAD_SIZE,
                               "block_size": BLOCK_SIZE, "dtype": str(DTYPE)}, "decode": [], "prefill": []}
    copies = [copy_bandwidth() for _ in range(3)]
    copy_bw = statistics.median(copies)
    results["copy_bandwidth_GBps"] = copy_bw / 1e9
    print(f"{props.name}: copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write; runs {[round(c / 1e12, 2) for c in copies]})")
    for batch in BATCHES:
        for context in CONTEXTS:
            cases = rotated_cases(batch, context)
            case = cases[0]
            splits = choose_num_splits(batch, NUM_KV_HEADS, context, props.multi_processor_count)
            graph_ms = bench_decode_graph(cases, splits)
            out = torch.empty_like(case["query"])
            row = {"batch": batch, "context": context, "num_splits": splits, "kv_MB": case["kv_bytes"] / 1e6,
                   "rotated_caches": len(cases), "graph_ms": graph_ms,
                   "graph_GBps": case["kv_bytes"] / (graph_ms * 1e-3) / 1e9,
                   "eager_ms": bench_decode(case, splits),
                   "host_us": host_overhead_us(decode_call(case, out, splits)),
                   "backend_forward_eager_ms": bench_backend_forward(case, batch, context),
                   "sdpa_contiguous_ms": bench_sdpa_peer(batch, context)}
            row["fraction_of_copy_bw"] = row["graph_GBps"] * 1e9 / copy_bw
            if args.sweep:
                sweep = {}
                for s in sorted({1, 2, 4, 8, 16, 32, splits}):
                    for block_n, warps, stages in ((64, 4, 3), (64, 4, 2), (32, 4, 2), (128, 8, 2), (64, 8, 3)):
                        key = f"s{s}-n{block_n}-w{warps}-st{stages}"
                        sweep[key] = bench_decode_graph(cases, s, block_n=block_n, num_warps=warps,
                                                        num_stages=stages)
                best = min(sweep, key=sweep.get)
                row["sweep_best"] = {"config": best, "ms": sweep[best],
                                     "GBps": case["kv_bytes"] / (sweep[best] * 1e-3) / 1e9}
                row["sweep"] = sweep
            results["decode"].append(row)
            del cases, case
            torch.cuda.empty_cache()
    for query_len in (1024, 4096):
        results["prefill"].append(bench_prefill(query_len))
    if args.sweep:
        for tile in ((64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 2), (128, 128, 8, 2)):
            results["prefill"].append(bench_prefill(4096, tile))
    print(f"\n{'batch':>5} {'ctx':>5} {'splits':>6} {'KV MB':>8} {'graph us':>8} {'GB/s':>6} {'of copy':>7} "
          f"{'eager us':>8} {'host us':>7} {'fwd us':>7} {'sdpa us':>7}" + ("  sweep best (graph)" if args.sweep else ""))
    for r in results["decode"]:
        line = (f"{r['batch']:>5} {r['context']:>5} {r['num_splits']:>6} {r['kv_MB']:>8.1f} {r['graph_ms'] * 1e3:>8.1f} "
                f"{r['graph_GBps']:>6.0f} {r['fraction_of_copy_bw']:>7.1%} {r['eager_ms'] * 1e3:>8.1f} "
                f"{r['host_us']:>7.1f} {r['backend_forward_eager_ms'] * 1e3:>7.1f} {r['sdpa_contiguous_ms'] * 1e3:>7.1f}")
        if args.sweep:
            b = r["sweep_best"]
            line += f"  {b['config']} {b['ms'] * 1e3:.1f}us {b['GBps']:.0f}GB/s"
        print(line)
    for p in results["prefill"]:
        print(f"prefill q={p['query_len']} tile={p['tile'] or 'default'}: {p['ms']:.3f} ms, {p['tflops']:.0f} TFLOP/s")
    results["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
