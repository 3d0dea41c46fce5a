"""What LoRA serving and n-gram speculative decoding cost (or save) per decode step on the GPU.

Dummy weights of a model shape (no real text), so the runs are built to make each feature do its work:

* ``plain``: the engine as bench 1 runs it, batches of ``--batch-sizes`` requests, 128 random prompt tokens,
  ``--output-len`` tokens, greedy, ignore_eos.
* ``plain-allowed``: the same, sampling only from 8 token ids (``allowed_token_ids``), so outputs repeat
  themselves: the baseline for ``spec``.
* ``spec``: ``plain-allowed`` with n-gram speculation (4 draft tokens, lookup 1..4): drafts are proposed at
  almost every step, and accepted where the random model happens to repeat itself. Reported with the
  scheduler's draft and acceptance counts.
* ``lora-base`` and ``lora-adapter``: an engine with ``enable_lora`` (rank 16, max 1 adapter), a random PEFT
  adapter on every projection; requests on the base model, then on the adapter.

Figure: milliseconds per output token per request, ``elapsed / output_len`` of one ``LLM.generate`` call
(median of 3 after a warm-up; prefill included, ~1-2% at 256 tokens), and its ratio to ``plain``.

Usage (CUDA machine)::

    python benchmarks/lora_spec_cost.py benchmarks/configs/llama-3.1-8b --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from brigade import LLM, SamplingParams
from brigade.benchmarks.datasets import random_requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "lora"))
from lora_utils import write_adapter  # noqa: E402

def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def time_generate(llm: LLM, batch: int, output_len: int, vocab: int, *, allowed: list[int] | None = None,
                  lora=None, repeats: int = 3) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, allowed_token_ids=allowed)
    times = []
    for it in range(repeats + 1):
        prompts = [r.prompt_token_ids for r in random_requests(batch, 128, output_len, vocab_size=vocab,
                                                               seed=1000 * batch + it)]
        sync()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
        sync()
        if it:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times) / output_len


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    common = dict(load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=2048,
                  max_num_seqs=max(batches))
    allowed = list(range(1000, 1008))
    rows: dict[str, dict] = {}

    def release() -> None:  # after the caller dropped its engine (and shut it down)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    llm = LLM(args.model, **common)
    vocab = llm.engine.core.executor.hf_config.vocab_size
    for b in batches:
        rows[f"plain b{b}"] = {"ms_per_token": time_generate(llm, b, args.output_len, vocab)}
        rows[f"plain-allowed b{b}"] = {"ms_per_token": time_generate(llm, b, args.output_len, vocab,
                                                                     allowed=allowed)}
    llm.engine.core.shutdown()
    del llm
    release()

    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    llm = LLM(args.model, speculative_config=spec, **common)
    for b in batches:
        before = dict(llm.engine.core.scheduler.spec_totals)
        ms = time_generate(llm, b, args.output_len, vocab, allowed=allowed)
        after = llm.engine.core.scheduler.spec_totals
        d = {k: after[k] - before[k] for k in after}
        rows[f"spec b{b}"] = {"ms_per_token": ms, **d,
                              "acceptance": d["num_accepted_tokens"] / max(1, d["num_draft_tokens"]),
                              "tokens_per_verify_step": 1 + d["num_accepted_tokens"] / max(1, d["num_drafts"])}
    llm.engine.core.shutdown()
    del llm
    release()

    from transformers import AutoConfig

    from brigade.lora import LoRARequest

    with tempfile.TemporaryDirectory() as tmp:
        adapter = write_adapter(Path(tmp) / "adapter", AutoConfig.from_pretrained(args.model), seed=0, rank=16,
                                alpha=32, targets=ALL_MODULES, std=0.01)
        llm = LLM(args.model, enable_lora=True, max_loras=1, max_lora_rank=16, **common)
        lora = LoRARequest("bench", 1, str(adapter))
        for b in batches:
            rows[f"lora-base b{b}"] = {"ms_per_token": time_generate(llm, b, args.output_len, vocab)}
            rows[f"lora-adapter b{b}"] = {"ms_per_token": time_generate(llm, b, args.output_len, vocab, lora=lora)}
        llm.engine.core.shutdown()
    del llm
    release()

    for name, row in rows.items():
        base = rows[f"plain b{name.split(' b')[1]}"]["ms_per_token"]
        row["ratio_to_plain"] = row["ms_per_token"] / base
        print(f"{name:22s} {row['ms_per_token']:7.3f} ms/token  x{row['ratio_to_plain']:.2f}  "
              + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                         if k not in ("ms_per_token", "ratio_to_plain")), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "output_len": args.output_len, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
