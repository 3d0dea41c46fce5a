"""Offline throughput: submit every request at once to the LLM class and time until the last one finishes.

This is vLLM's ``bench throughput`` measure: requests/s, output tokens/s and total (prompt + output)
tokens/s over the wall time of one ``LLM.generate`` call. Sampling follows vLLM's benchmark: temperature
1.0, top_p 1.0 and ``ignore_eos``, so every request generates exactly its ``output_len`` tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from brigade.benchmarks.datasets import SampleRequest, random_requests
from brigade.sampling_params import SamplingParams

# Offset of the warm-up prompts' seed, so they share no prefix (and no prefix-cache block) with the real ones.
WARMUP_SEED_OFFSET = 1_000_003


@dataclass(slots=True)
class ThroughputFigures:
    """One timed run over a request set. Token counts are those delivered to the user.

    ``cpu_time_s`` is this process's CPU time (all threads, user + system) over the same region: on a
    machine shared with other work it is the less disturbed measure of cost (with one thread especially).
    """

    elapsed_s: float
    num_requests: int
    num_prompt_tokens: int
    num_output_tokens: int
    cpu_time_s: float | None = None

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.elapsed_s

    def as_dict(self) -> dict[str, float | int]:
        return {"elapsed_s": self.elapsed_s, "cpu_time_s": self.cpu_time_s, "num_requests": self.num_requests,
                "num_prompt_tokens": self.num_prompt_tokens, "num_output_tokens": self.num_output_tokens,
                "requests_per_s": self.requests_per_s, "output_tokens_per_s": self.output_tokens_per_s,
                "total_tokens_per_s": self.total_tokens_per_s}


def bench_sampling_params(output_len: int, **overrides) -> SamplingParams:
    """vLLM's benchmark sampling: temperature 1.0, top_p 1.0, ignore_eos, exactly ``output_len`` tokens."""
    return SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len, **overrides)


def warmup_requests(requests: list[SampleRequest], *, vocab_size: int, seed: int,
                    num_requests: int = 2, output_len: int = 4) -> list[SampleRequest]:
    """A few short requests shaped like the first real one but with other token ids (no prefix-cache hits)."""
    input_len = min(r.prompt_len for r in requests)
    return random_requests(min(num_requests, len(requests)), input_len, output_len, vocab_size=vocab_size,
                           seed=seed + WARMUP_SEED_OFFSET)


def penalized_rows(num_requests: int, fraction: float) -> list[bool]:
    """Which of ``num_requests`` requests use the repetition penalty so that ``fraction`` of them do, spread
    evenly (request i does when floor((i + 1) * fraction) > floor(i * fraction))."""
    return [int((i + 1) * fraction) > int(i * fraction) for i in range(num_requests)]


def run_brigade_throughput(llm, requests: list[SampleRequest], *, synchronize: Callable[[], None],
                           repetition_penalty: float = 1.0,
                           repetition_penalty_fraction: float = 0.0) -> ThroughputFigures:
    """Time one ``llm.generate`` over all requests (submitted together, continuous batching).

    Args:
        llm: a ``brigade.LLM``.
        requests: the request set; each generates exactly its ``output_len`` tokens (ignore_eos).
        synchronize: the platform's device synchronize, called before the clock starts and after it stops.
        repetition_penalty, repetition_penalty_fraction: that share of the requests (``penalized_rows``) sample
            with that penalty: what one request's feature costs the whole batch.
    Raises:
        RuntimeError: a request came back with a token count other than the one asked.
    """
    prompts = [r.prompt_token_ids for r in requests]
    penalized = penalized_rows(len(requests), repetition_penalty_fraction)
    params = [bench_sampling_params(r.output_len, **({"repetition_penalty": repetition_penalty} if p else {}))
              for r, p in zip(requests, penalized)]
    synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    synchronize()
    elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    num_output = 0
    for request, output in zip(requests, outputs):
        got = len(output.outputs[0].token_ids)
        if got != request.output_len:
            raise RuntimeError(f"request {output.request_id} generated {got} tokens, expected {request.output_len} "
                               f"(finish_reason {output.outputs[0].finish_reason!r})")
        num_output += got
    return ThroughputFigures(elapsed, len(requests), sum(r.prompt_len for r in requests), num_output, cpu_time)


def warm_up_brigade(llm, requests: list[SampleRequest]) -> None:
    """Run the warm-up requests (untimed): first-call allocations, lazy imports, kernel selection."""
    llm.generate([r.prompt_token_ids for r in requests], [bench_sampling_params(r.output_len) for r in requests],
                 use_tqdm=False)
