"""Where an n-gram speculative decoding step's time goes on the GPU (host side): cProfile of one batch-1 run
with drafts at almost every step (outputs sampled from 8 token ids, as in ``lora_spec_cost.py``), next to the
same run without speculation under ``enforce_eager`` (an eager step, no drafts) and with decode graphs.

Usage (CUDA machine)::

    python benchmarks/profile_speculative_step.py benchmarks/configs/llama-3.1-8b --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import time

import torch

from brigade import LLM, SamplingParams
from brigade.benchmarks.datasets import random_requests

ALLOWED = list(range(1000, 1008))


def run(llm: LLM, output_len: int, seed: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, allowed_token_ids=ALLOWED)
    prompt = random_requests(1, 128, output_len, vocab_size=128000, seed=seed)[0].prompt_token_ids
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / output_len


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--json")
    args = parser.parse_args()
    common = dict(load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=2048,
                  max_num_seqs=8)
    report = {}
    for name, extra in (("graphs", {}), ("eager", {"enforce_eager": True}),
                        ("spec", {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                                         "prompt_lookup_max": 4, "prompt_lookup_min": 1}})):
        llm = LLM(args.model, **common, **extra)
        run(llm, args.output_len, 0)
        report[name] = {"ms_per_token": min(run(llm, args.output_len, s) for s in (1, 2))}
        if name == "spec":
            before = dict(llm.engine.core.scheduler.spec_totals)
            prof = cProfile.Profile()
            prof.enable()
            ms = run(llm, args.output_len, 3)
            prof.disable()
            after = llm.engine.core.scheduler.spec_totals
            report[name]["profiled_ms_per_token"] = ms
            report[name]["steps"] = after["num_drafts"] - before["num_drafts"]
            for key in ("tottime", "cumulative"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(35)
                report[name][f"top_{key}"] = buf.getvalue()
                print(buf.getvalue()[-9000:], flush=True)
        print(name, report[name]["ms_per_token"], flush=True)
        llm.engine.core.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
