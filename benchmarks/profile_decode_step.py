"""Where the time of a batch-1 decode step goes on the GPU: kernels of the captured decode graphs, by name.

Runs one request (128 random prompt tokens, ``--output-len`` greedy tokens, ignore_eos) through ``LLM`` on a
model directory with dummy weights, under ``torch.profiler`` (CUPTI records each kernel of a replayed CUDA
graph), and reports per decode step:

* ``span``: first to last kernel of the decode region over the number of decode steps (about the TPOT);
* ``busy``: the union of kernel intervals, and ``idle`` = span - busy (gaps where no kernel runs);
* per kernel name: launches per step and device time per step;
* ``between_graphs``: each device operation from the LM head of one step to the next step's embedding
  gather, with the idle gap before it (what the step does outside its graph, and what waits on the host);
* ``graph_replay_us``: one batch-1 decode graph replayed back to back (TPOT minus it is the work outside
  the graph).

With programmatic dependent launch on (``BRIGADE_CUDA_PDL``, the default) a kernel starts while its
predecessor drains and its recorded time includes the wait, so per-kernel times are only meaningful with
``BRIGADE_CUDA_PDL=0``; span and busy are meaningful either way.

Usage (CUDA machine, Brigade and brigade-cuda installed)::

    python benchmarks/profile_decode_step.py benchmarks/configs/llama-3.1-8b --json out.json [--trace t.json] \
        [--batch-sizes 1,64] [--quantization fp8] [--kv-cache-dtype fp8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from brigade.entrypoints.llm import LLM
from brigade.sampling_params import SamplingParams


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def analyze(kernels: list[dict], num_layers: int) -> dict:
    """Per-step figures of the decode region: kernels after the last prefill-attention kernel."""
    kernels = sorted(kernels, key=lambda k: k["ts"])
    last_prefill = max((i for i, k in enumerate(kernels) if "prefill" in k["name"]), default=-1)
    decode = kernels[last_prefill + 1:]
    steps = sum("_decode_split_kernel" in k["name"] for k in decode) / num_layers
    if not decode or steps < 1:
        raise SystemExit("no decode kernels in the trace")
    span = decode[-1]["ts"] + decode[-1]["dur"] - decode[0]["ts"]
    busy = _union([(k["ts"], k["ts"] + k["dur"]) for k in decode])
    by_name: dict[str, list[float]] = defaultdict(list)
    for k in decode:
        by_name[k["name"]].append(k["dur"])
    table = sorted(({"kernel": name[:90], "per_step": len(d) / steps, "us_per_step": sum(d) / steps,
                     "mean_us": sum(d) / len(d)} for name, d in by_name.items()), key=lambda r: -r["us_per_step"])
    return {"decode_steps": steps, "span_us_per_step": span / steps, "busy_us_per_step": busy / steps,
            "idle_us_per_step": (span - busy) / steps, "kernels_per_step": len(decode) / steps,
            "sum_kernel_us_per_step": sum(k["dur"] for k in decode) / steps, "by_kernel": table}


def boundary(events: list[dict], num_steps: int = 16) -> list[dict]:
    """The device work between two decode graphs, in order: every kernel, memcpy and memset after the last
    GEMV of one step (the LM head) up to the next step's embedding gather, with the idle gap before each.

    ``events`` carry name, ts, dur (us). Returns, for the position-wise most common sequence over the last
    ``num_steps`` steps, one row per event: name, median gap before it (us) and median duration (us); the
    last row is the next graph's embedding gather, so the gaps and durations sum to the time outside the
    graph's own kernels.
    """
    events = sorted(events, key=lambda k: k["ts"])
    embeds = [i for i, e in enumerate(events) if "indexSelect" in e["name"]]
    windows = []
    for a, b in zip(embeds, embeds[1:]):
        lm_head = max((i for i in range(a, b) if "gemv" in events[i]["name"] or "gemm" in events[i]["name"]),
                      default=None)
        if lm_head is not None:
            windows.append(events[lm_head:b + 1])
    windows = windows[-num_steps:]
    if not windows:
        return []
    names = [tuple(e["name"] for e in w) for w in windows]
    common = max(set(names), key=names.count)
    chosen = [w for w, n in zip(windows, names) if n == common]
    rows = []
    for j in range(1, len(common)):
        gaps = sorted(w[j]["ts"] - (w[j - 1]["ts"] + w[j - 1]["dur"]) for w in chosen)
        durs = sorted(w[j]["dur"] for w in chosen)
        rows.append({"name": common[j][:90], "gap_us": gaps[len(gaps) // 2], "dur_us": durs[len(durs) // 2]})
    return rows


def replay_times(graphs, batch_size: int = 1, iters: int = 200) -> dict[str, float]:
    """Device time of one replay of each decode graph of ``batch_size`` (back to back, CUDA events), by
    context bucket: the step's time inside its graph, so TPOT minus this is the per-step work outside it
    (input copies, sampler, host gaps). Replays the buffers' current contents (the last decode step)."""
    times = {}
    for (size, bucket), graph in sorted(graphs.graphs.items()):
        if size != batch_size:
            continue
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times[str(bucket)] = start.elapsed_time(end) * 1000 / iters
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--trace", help="also write the Chrome trace here")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else random")
    parser.add_argument("--batch-sizes", default="1", help="comma list: profile a decode batch of each size "
                        "(that many requests of distinct prompts, started together), one after the other")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--quantization", help="as brigade's flag, e.g. fp8 (online FP8 of the dummy weights)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="as brigade's flag: auto or fp8")
    args = parser.parse_args()
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=2048,
              max_num_seqs=max(256, *(int(b) for b in args.batch_sizes.split(","))),
              quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype)
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        results[batch_size] = profile_batch(llm, args, batch_size)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results if len(results) > 1 else next(iter(results.values())), f, indent=2)


def profile_batch(llm, args, batch_size: int) -> dict:
    rng = random.Random(batch_size)
    prompts = [[rng.randrange(1000, 30000) for _ in range(args.prompt_len)] for _ in range(batch_size)]
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=args.temperature)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: compiles, graphs captured at start
    llm.reset_prefix_cache()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
    trace = args.trace or f"/tmp/brigade_decode_trace_{batch_size}.json"
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    kernels = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])}
               for e in events if e.get("cat") == "kernel"]
    device_ops = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])}
                  for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    num_layers = llm.engine.core.executor.hf_config.num_hidden_layers
    result = analyze(kernels, num_layers)
    result["between_graphs"] = boundary(device_ops)
    result["batch_size"] = batch_size
    graphs = llm.engine.core.executor.worker.model_runner.graphs.decode
    graph_size = min((size for size, _ in graphs.graphs if size >= batch_size), default=batch_size)
    result["graph_replay_us"] = replay_times(graphs, graph_size)
    result["env"] = {k: v for k, v in os.environ.items() if k.startswith("BRIGADE_CUDA")}
    result["device"] = torch.cuda.get_device_name()
    print(f"batch {batch_size}: decode steps {result['decode_steps']:.0f}: span {result['span_us_per_step']:.0f} us/step, busy "
          f"{result['busy_us_per_step']:.0f}, idle {result['idle_us_per_step']:.0f}, "
          f"{result['kernels_per_step']:.0f} kernels/step, kernel time sum {result['sum_kernel_us_per_step']:.0f}")
    print("graph replay us/step by context bucket:", {k: round(v, 1) for k, v in result["graph_replay_us"].items()})
    for row in result["by_kernel"][:16]:
        print(f"  {row['us_per_step']:8.1f} us/step  x{row['per_step']:5.1f}  mean {row['mean_us']:6.2f}  "
              f"{row['kernel']}")
    print("between two decode graphs (gap before, duration):")
    for row in result["between_graphs"]:
        print(f"  +{row['gap_us']:6.1f}  {row['dur_us']:6.1f}  {row['name']}")
    return result


if __name__ == "__main__":
    main()
