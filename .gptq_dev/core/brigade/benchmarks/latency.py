"""Offline latency of one batch: end-to-end time, time to first token (TTFT) and time per output token (TPOT).

Each iteration submits ``batch_size`` prompts of ``input_len`` random token ids at once, each generating
exactly ``output_len`` tokens (ignore_eos), and waits for all of them, as vLLM's ``bench latency`` does.

How the times are taken (the same way for Brigade and the HF peer, so the figures compare):

* **latency** is the wall time of the whole batch, from submission to the last token.
* **TTFT** of a request is the time from submission to the end of the engine step that produced its
  first token. Brigade is driven step by step through ``LLMEngine`` with DELTA outputs, so the first
  step that returns a request's token gives that time exactly, at step granularity. HF ``generate``
  reports each step through a streamer whose ``put`` synchronizes the device and reads the clock.
* **TPOT** of a request is ``(its e2e - its TTFT) / (output_len - 1)``: the mean decode step time it saw.

There is no separate ``max_tokens=1`` run: that would time a different schedule.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from brigade.benchmarks.datasets import SampleRequest
from brigade.benchmarks.results import summarize
from brigade.sampling_params import RequestOutputKind


@dataclass(slots=True)
class IterationTiming:
    """One batch: its wall time and, per request, TTFT and end-to-end time (seconds from submission)."""

    latency_s: float
    ttfts_s: list[float] = field(default_factory=list)
    e2es_s: list[float] = field(default_factory=list)

    def tpots_s(self, output_len: int) -> list[float]:
        """Per-request TPOT; empty when output_len is 1 (no decode step to time)."""
        if output_len < 2:
            return []
        return [(e2e - ttft) / (output_len - 1) for e2e, ttft in zip(self.e2es_s, self.ttfts_s)]


def latency_summary(iterations: list[IterationTiming], output_len: int) -> dict[str, dict]:
    """Mean/median/p99 (milliseconds) of batch latency, TTFT and TPOT over all timed iterations."""
    return {
        "latency_ms": summarize([it.latency_s for it in iterations], scale=1000.0),
        "ttft_ms": summarize([t for it in iterations for t in it.ttfts_s], scale=1000.0),
        "tpot_ms": summarize([t for it in iterations for t in it.tpots_s(output_len)], scale=1000.0),
        "num_iterations": len(iterations),
    }


class BrigadeLatencyRunner:
    """Runs one batch at a time through an ``LLMEngine``, noting when each request's tokens come out.

    Args:
        engine: ``LLM(...).engine``, the synchronous engine (in this process).
        synchronize: the platform's device synchronize.
    """

    def __init__(self, engine, synchronize: Callable[[], None]):
        self.engine = engine
        self.synchronize = synchronize
        self._ids = itertools.count()

    def run_batch(self, requests: list[SampleRequest]) -> IterationTiming:
        """Submit ``requests`` together and step until all finish.

        Raises:
            RuntimeError: a request finished with a token count other than its output_len.
        """
        from brigade.benchmarks.throughput import bench_sampling_params

        self.synchronize()
        start = time.perf_counter()
        wanted: dict[str, int] = {}
        for r in requests:
            request_id = f"latency-{next(self._ids)}"
            params = bench_sampling_params(r.output_len, output_kind=RequestOutputKind.DELTA)
            self.engine.add_request(request_id, r.prompt_token_ids, params)
            wanted[request_id] = r.output_len
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        counts = dict.fromkeys(wanted, 0)
        while self.engine.has_unfinished_requests():
            outputs = self.engine.step()
            now = time.perf_counter()  # step() returns host token ids: the device work is done
            for out in outputs:
                if out.request_id not in wanted:
                    continue
                new = len(out.outputs[0].token_ids)
                if new and out.request_id not in first:
                    first[out.request_id] = now
                counts[out.request_id] += new
                if out.finished:
                    last[out.request_id] = now
        self.synchronize()
        latency = time.perf_counter() - start
        wrong = {k: (counts[k], v) for k, v in wanted.items() if counts[k] != v}
        if wrong:
            raise RuntimeError(f"requests finished with wrong token counts (got, wanted): {wrong}")
        return IterationTiming(latency, [first[k] - start for k in wanted], [last[k] - start for k in wanted])


def hf_latency_batch(model, requests: list[SampleRequest], *, synchronize: Callable[[], None]) -> IterationTiming:
    """One HF ``generate`` over the batch (all prompts share one length, so no padding), timed per step.

    Raises:
        RuntimeError: the streamer saw fewer steps than ``output_len``.
    """
    from brigade.benchmarks.hf_peer import TimingStreamer, hf_generate

    output_len = max(r.output_len for r in requests)
    streamer = TimingStreamer(synchronize)
    synchronize()
    start = time.perf_counter()
    hf_generate(model, [r.prompt_token_ids for r in requests], output_len, synchronize=synchronize,
                streamer=streamer)
    latency = time.perf_counter() - start
    if len(streamer.token_times) < output_len:
        raise RuntimeError(f"HF generate streamed {len(streamer.token_times)} steps, expected {output_len}")
    ttft = streamer.token_times[0] - start
    # A static batch: every request gets its first token in the same step and its last in the last step.
    e2e = streamer.token_times[output_len - 1] - start
    return IterationTiming(latency, [ttft] * len(requests), [e2e] * len(requests))


def run_iterations(run_batch: Callable[[], IterationTiming], *, num_warmup: int, num_iters: int,
                   on_iteration: Callable[[str, int, IterationTiming], None] | None = None) -> list[IterationTiming]:
    """``num_warmup`` untimed then ``num_iters`` timed calls of ``run_batch``; returns the timed ones."""
    for i in range(num_warmup):
        timing = run_batch()
        if on_iteration:
            on_iteration("warmup", i, timing)
    timed = []
    for i in range(num_iters):
        timing = run_batch()
        timed.append(timing)
        if on_iteration:
            on_iteration("timed", i, timing)
    return timed
