"""How far online FP8 (brigade-fp8, W8A8 e4m3), or an FP8 checkpoint, moves SmolLM2-135M-Instruct from bf16, on the CPU.

For each of a fixed set of chat prompts: the greedy answer in bf16 and with ``--quantization fp8`` (how many are
identical, and where the first differing token sits), and the logprob drift: the bf16 answer scored token by token
(teacher-forced, as prompt logprobs of prompt + answer) under both models, mean and largest |difference|. The same
figures for fp32 against bf16 give the yardstick: how far bf16's own rounding moves the model.

The CPU runs FP8 emulated in fp32 (activations quantized per token exactly as on the GPU, products of the
dequantized codes), so these are the scheme's own errors, without the GPU GEMM's bf16 output rounding.

Usage: ``python benchmarks/fp8_drift.py [--model DIR] [--checkpoint FP8_DIR] [--max-tokens 48] [--json OUT.json]``.
``--checkpoint`` measures that FP8 checkpoint of the model (for example llm-compressor's ``FP8_DYNAMIC``, its scheme
read from its config.json) instead of online FP8.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the moon.",
    "Explain what a hash table is in two sentences.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
    "Give me a tip for learning a new language.",
    "What does a compiler do?",
    "Name the planets of the solar system in order.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Suggest a name for a black cat.",
]


def _run(model: str, quantization: str | None, prompt_ids: list[list[int]], max_tokens: int,
         dtype: str = "bfloat16"):
    from brigade import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, quantization=quantization, max_model_len=512)
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    answers = [o.outputs[0].token_ids for o in llm.generate(prompt_ids, greedy, use_tqdm=False)]
    return llm, answers


def _scores(llm, prompt_ids: list[list[int]], answers: list[list[int]]) -> list[list[float]]:
    """Teacher-forced logprob of each answer token after its prompt (prompt logprobs of prompt + answer)."""
    from brigade import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([p + a for p, a in zip(prompt_ids, answers)], params, use_tqdm=False)
    scores = []
    for out, p, a in zip(outs, prompt_ids, answers):
        rows = out.prompt_logprobs[len(p):]
        scores.append([row[t].logprob for row, t in zip(rows, a)])
    return scores


def main() -> None:
    from brigade.cache_paths import default_model_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(default_model_dir()))
    parser.add_argument("--checkpoint", help="an FP8 checkpoint of --model to measure instead of online FP8")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    prompt_ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for p in PROMPTS]
    start = time.perf_counter()
    bf16, bf16_answers = _run(args.model, None, prompt_ids, args.max_tokens)
    bf16_scores = _scores(bf16, prompt_ids, bf16_answers)
    del bf16
    fp8, fp8_answers = (_run(args.checkpoint, None, prompt_ids, args.max_tokens) if args.checkpoint
                        else _run(args.model, "fp8", prompt_ids, args.max_tokens))
    fp8_scores = _scores(fp8, prompt_ids, bf16_answers)  # the bf16 answer, scored by the FP8 model
    del fp8

    fp32, fp32_answers = _run(args.model, None, prompt_ids, args.max_tokens, dtype="float32")
    fp32_scores = _scores(fp32, prompt_ids, bf16_answers)
    del fp32

    def compare(answers, scores) -> dict:
        first_diff = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                      for a, b in zip(bf16_answers, answers)]
        drift = [abs(x - y) for s, t in zip(bf16_scores, scores) for x, y in zip(s, t)]
        return {"identical_answers": sum(d is None for d in first_diff), "first_differing_token": first_diff,
                "mean_abs_logprob_drift": sum(drift) / len(drift), "max_abs_logprob_drift": max(drift),
                "mean_token_logprob": sum(map(sum, scores)) / len(drift)}

    record = {
        "model": os.path.basename(os.path.normpath(args.model)), "prompts": len(PROMPTS),
        "fp8": os.path.basename(os.path.normpath(args.checkpoint)) if args.checkpoint else "online --quantization fp8",
        "max_tokens": args.max_tokens,
        "mean_token_logprob_bf16": sum(map(sum, bf16_scores)) / sum(map(len, bf16_scores)),
        "fp8_vs_bf16": compare(fp8_answers, fp8_scores), "fp32_vs_bf16": compare(fp32_answers, fp32_scores),
        "answers_bf16": [tok.decode(a) for a in bf16_answers], "answers_fp8": [tok.decode(a) for a in fp8_answers],
        "seconds": round(time.perf_counter() - start, 1), "machine": platform.machine(),
    }
    for name in ("fp8_vs_bf16", "fp32_vs_bf16"):
        r = record[name]
        print(f"{name}: identical greedy answers {r['identical_answers']}/{len(PROMPTS)} (first differing token: "
              f"{r['first_differing_token']}); logprob drift of the bf16 answers' tokens: mean "
              f"{r['mean_abs_logprob_drift']:.4f}, max {r['max_abs_logprob_drift']:.4f} nats; mean token logprob "
              f"{r['mean_token_logprob']:.4f} (bf16 {record['mean_token_logprob_bf16']:.4f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
