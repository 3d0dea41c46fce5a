"""Where the time of a short, long-tailed throughput run goes, step by step (bench 4's ShareGPT-like subset).

Runs ``--num-prompts`` of bench 3's ShareGPT-like requests through ``LLM.generate`` (ignore_eos, exact output
lengths) after a warm-up, and records when the scheduler plans each step and what it plans (running requests,
scheduled tokens). The interval between two plans is one step's wall time (with asynchronous scheduling the
engine plans step N+1 while the device runs step N, so in steady state it is the device's step time).

Reports the elapsed time, the number of steps, and the steps and seconds grouped by kind (a step with prompt
tokens is a prefill step) and by decode batch size, with the mean step time in each group. A second pass of
the same requests runs under ``--repeat`` to show the spread. Also per engine step (``LLM.engine.step``): its
wall time split into the wait for the device (the sampled tokens' CUDA event) and host work, grouped by the
batch planned in that call; the garbage collector's pauses by generation; and when the last request was added.

Usage (CUDA machine, Brigade and brigade-cuda installed)::

    python benchmarks/profile_engine_steps.py benchmarks/configs/llama-3.1-8b --num-prompts 128 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections import defaultdict

import torch

from brigade import LLM
from brigade.benchmarks.datasets import sharegpt_like_requests
from brigade.benchmarks.throughput import bench_sampling_params

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def bucket(n: int) -> str:
    for b in BUCKETS:
        if n <= b:
            return f"<={b}"
    return f">{BUCKETS[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=4096,
              max_num_seqs=512, max_num_batched_tokens=args.max_num_batched_tokens)
    vocab = llm.engine.core.executor.hf_config.vocab_size
    requests = sharegpt_like_requests(args.num_prompts, vocab_size=vocab, max_model_len=4096)
    scheduler = llm.engine.core.scheduler
    plans: list[tuple[float, int, int, int]] = []  # (time, requests, tokens, prompt tokens)
    schedule = scheduler.schedule

    def timed_schedule():
        out = schedule()
        reqs = len(out.num_scheduled_tokens)
        prompt_tokens = out.total_num_scheduled_tokens - sum(1 for n in out.num_scheduled_tokens.values() if n == 1)
        plans.append((time.perf_counter(), reqs, out.total_num_scheduled_tokens, prompt_tokens))
        return out

    scheduler.schedule = timed_schedule
    # Host time: per engine step, its wall time and the part spent waiting for the device (the sampled tokens'
    # event); the rest is host work (plan, input preparation, launches, output processing). A bucket whose
    # steps wait ~0 on the device is host-bound. Plus the garbage collector's pauses and when the last request
    # was added (the time before the first plan).
    waits: list[float] = []
    sync = torch.cuda.Event.synchronize

    def timed_sync(event):
        t = time.perf_counter()
        sync(event)
        waits.append(time.perf_counter() - t)

    torch.cuda.Event.synchronize = timed_sync
    engine_steps: list[tuple[float, float, int]] = []  # (wall, device wait, requests planned in that call)
    step = llm.engine.step

    def timed_step():
        n_plans, n_waits = len(plans), len(waits)
        t = time.perf_counter()
        out = step()
        wall = time.perf_counter() - t
        engine_steps.append((wall, sum(waits[n_waits:]), plans[-1][1] if len(plans) > n_plans else 0))
        return out

    llm.engine.step = timed_step
    add_request = llm.engine.add_request
    added: list[float] = []

    def timed_add(*a, **k):
        out = add_request(*a, **k)
        added.append(time.perf_counter())
        return out

    llm.engine.add_request = timed_add
    gc_pauses: list[tuple[int, float]] = []
    gc_start = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_pauses.append((info["generation"], time.perf_counter() - gc_start[0]))

    gc.callbacks.append(on_gc)
    warm = sharegpt_like_requests(8, vocab_size=vocab, max_model_len=4096, seed=99)
    llm.generate([r.prompt_token_ids for r in warm], [bench_sampling_params(8) for _ in warm], use_tqdm=False)
    report = []
    for rep in range(args.repeat):
        llm.reset_prefix_cache()
        # other token ids each pass, so the second pass does not hit the prefix cache
        reqs = sharegpt_like_requests(args.num_prompts, vocab_size=vocab, max_model_len=4096, seed=rep)
        plans.clear()
        engine_steps.clear()
        added.clear()
        gc_pauses.clear()
        start = time.perf_counter()
        llm.generate([r.prompt_token_ids for r in reqs], [bench_sampling_params(r.output_len) for r in reqs],
                     use_tqdm=False)
        end = time.perf_counter()
        groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for (t, n, tok, ptok), nxt in zip(plans, [p[0] for p in plans[1:]] + [end]):
            if tok == 0:
                key = "empty"
            elif ptok:
                key = f"prefill (tokens {bucket(tok)})"
            else:
                key = f"decode batch {bucket(n)}"
            groups[key][0] += 1
            groups[key][1] += nxt - t
        rec = {"elapsed_s": end - start, "before_first_plan_s": plans[0][0] - start if plans else None,
               "steps": len(plans), "output_tokens": sum(r.output_len for r in reqs),
               "max_output_len": max(r.output_len for r in reqs),
               "groups": {k: {"steps": v[0], "seconds": round(v[1], 4), "mean_ms": round(1e3 * v[1] / v[0], 3)}
                          for k, v in sorted(groups.items())},
               "requests_added_s": added[-1] - start if added else None,
               "gc": {f"gen{g}": {"count": sum(1 for x, _ in gc_pauses if x == g),
                                  "total_ms": round(1e3 * sum(d for x, d in gc_pauses if x == g), 2),
                                  "max_ms": round(1e3 * max([d for x, d in gc_pauses if x == g], default=0), 2)}
                      for g in (0, 1, 2)},
               "engine_steps": {}}
        host: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for wall, wait, n in engine_steps:
            h = host[f"planned batch {bucket(n)}" if n else "planned nothing"]
            h[0] += 1
            h[1] += wall
            h[2] += wait
        rec["engine_steps"] = {k: {"calls": v[0], "wall_ms_mean": round(1e3 * v[1] / v[0], 3),
                                   "device_wait_ms_mean": round(1e3 * v[2] / v[0], 3),
                                   "host_ms_mean": round(1e3 * (v[1] - v[2]) / v[0], 3)}
                               for k, v in sorted(host.items())}
        report.append(rec)
        print(json.dumps(rec, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"num_prompts": args.num_prompts, "passes": report}, f, indent=1)


if __name__ == "__main__":
    main()
