"""Brigade against its HF peers over the same requests: one sequential round, or interleaved rounds.

One round (the default) runs Brigade, shuts it down and frees its memory, then loads the HF model: on a
GPU both never hold memory at once. With ``--repeats N`` both stay loaded and the systems alternate for
N rounds (Brigade, peers, Brigade, peers, ...), each round on fresh prompts (seed + round x stride, so no
prefix-cache hits), and the reported figures are medians: on a machine shared with other work, slow
phases then hit both systems instead of whichever happened to run during them.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from brigade.benchmarks import results as rec
from brigade.benchmarks.datasets import SampleRequest, make_requests, prompt_vocab_size
from brigade.benchmarks.throughput import run_brigade_throughput, warm_up_brigade, warmup_requests

ROUND_SEED_STRIDE = 7919  # round r draws its prompts with seed + r * stride
RATIO_METRICS = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s")


@dataclass
class Comparison:
    """Per system: the figures of its median round (by output tok/s) and, with repeats, every round."""

    requests: list[SampleRequest]  # the first round's requests
    engine_config: object
    results: dict[str, dict] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)


class HFPeers:
    """The HF model and the peer modes to time on it (``generate``, ``generate_batch``)."""

    def __init__(self, model, modes: list[str], batch_size: int | None, synchronize: Callable[[], None]):
        self.model = model
        self.modes = modes
        self.batch_size = batch_size
        self.synchronize = synchronize

    def warm_up(self, warm: list[SampleRequest]) -> None:
        from brigade.benchmarks.hf_peer import run_hf_generate_throughput

        if "generate" in self.modes:
            run_hf_generate_throughput(self.model, warm, batch_size=len(warm), synchronize=self.synchronize)

    def run(self, requests: list[SampleRequest]) -> dict[str, dict]:
        from brigade.benchmarks.hf_peer import (PeerUnavailableError, run_hf_generate_batch_throughput,
                                                run_hf_generate_throughput)

        out: dict[str, dict] = {}
        if "generate" in self.modes:
            batch_size = self.batch_size or len(requests)
            figures, generated = run_hf_generate_throughput(self.model, requests, batch_size=batch_size,
                                                            synchronize=self.synchronize)
            out["hf_generate"] = {**figures.as_dict(), "batch_size": batch_size, "num_generated_tokens": generated,
                                  "load_average_after": rec.load_average()}
        if "generate_batch" in self.modes:
            try:
                figures = run_hf_generate_batch_throughput(self.model, requests, synchronize=self.synchronize)
                out["hf_generate_batch"] = {**figures.as_dict(), "load_average_after": rec.load_average()}
            except PeerUnavailableError as exc:
                print(f"warning: HF generate_batch peer skipped: {exc}", file=sys.stderr)
                out["hf_generate_batch"] = {"error": str(exc)}
        return out


def peer_modes(hf_peer: str) -> list[str]:
    """``--hf-peer`` to the list of modes to time."""
    return {"none": [], "generate": ["generate"], "generate_batch": ["generate_batch"],
            "both": ["generate", "generate_batch"]}[hf_peer]


def _median_round(rounds: list[dict]) -> dict:
    ok = [r for r in rounds if "output_tokens_per_s" in r]
    if not ok:
        return rounds[0]
    ranked = sorted(ok, key=lambda r: r["output_tokens_per_s"])
    return ranked[(len(ranked) - 1) // 2]


def _ratios(rounds: list[dict[str, dict]]) -> dict[str, float | None]:
    """Per peer and metric, the median over rounds of Brigade's figure / the peer's (and peer / Brigade CPU)."""
    ratios: dict[str, float | None] = {}
    peers = [p for p in rounds[0] if p.startswith("hf_") and "output_tokens_per_s" in rounds[0][p]]
    for peer in peers:
        for metric in RATIO_METRICS:
            values = [rec.ratio(r["brigade"][metric], r[peer][metric]) for r in rounds]
            ratios[f"brigade/{peer}/{metric}"] = statistics.median(v for v in values if v is not None)
        cpu = [rec.ratio(r[peer]["cpu_time_s"], r["brigade"]["cpu_time_s"]) for r in rounds]
        cpu = [v for v in cpu if v is not None]
        ratios[f"{peer}/brigade/cpu_time_s"] = statistics.median(cpu) if cpu else None
    return ratios


def run_comparison(config, args, platform, seed: int, *, load_peer_model: Callable[[object], object]) -> Comparison:
    """Time Brigade and the ``--hf-peer`` modes over ``--repeats`` rounds (see the module docstring).

    Args:
        load_peer_model: builds the HF model given the model's HF config (called once, if any peer is on).
    """
    from brigade.entrypoints.cli.start_engine import start_llm
    from brigade.model_executor.loader import get_hf_config

    modes = peer_modes(args.hf_peer)
    repeats = args.repeats
    llm = start_llm(config)
    hf_config = get_hf_config(config.model_config.model, config.model_config.trust_remote_code)
    vocab = prompt_vocab_size(hf_config.vocab_size, llm.get_tokenizer())
    max_len = llm.config.model_config.max_model_len
    request_sets = [make_requests(args.dataset, args.num_prompts, input_len=args.input_len,
                                  output_len=args.output_len, vocab_size=vocab, seed=seed + r * ROUND_SEED_STRIDE,
                                  max_model_len=max_len) for r in range(repeats)]
    warm = warmup_requests(request_sets[0], vocab_size=vocab, seed=seed)
    comparison = Comparison(request_sets[0], llm.config)
    rounds: list[dict[str, dict]] = [{} for _ in range(repeats)]
    peers: HFPeers | None = None
    try:
        warm_up_brigade(llm, warm)
        for r in range(repeats):
            figures = run_brigade_throughput(llm, request_sets[r], synchronize=platform.synchronize,
                                             repetition_penalty=args.repetition_penalty,
                                             repetition_penalty_fraction=args.repetition_penalty_fraction)
            rounds[r]["brigade"] = {**figures.as_dict(), "load_average_after": rec.load_average()}
            if not modes:
                continue
            if repeats == 1:  # free Brigade's memory first: on a GPU both may not fit
                llm.engine.core.shutdown()
                llm = None
                release_memory(platform)
            if peers is None:
                peers = HFPeers(load_peer_model(hf_config), modes, args.hf_batch_size, platform.synchronize)
                peers.warm_up(warm)
            rounds[r].update(peers.run(request_sets[r]))
            print(f"round {r + 1}/{repeats} done", flush=True)
    finally:
        if llm is not None:
            llm.engine.core.shutdown()
    for system in rounds[0]:
        per_round = [rd[system] for rd in rounds]
        comparison.results[system] = dict(_median_round(per_round))
        if repeats > 1:
            comparison.results[system]["rounds"] = per_round
    if modes:
        comparison.ratios = _ratios(rounds)
    return comparison


def release_memory(platform) -> None:
    """Collect garbage and return cached device memory (after an engine or a model is dropped)."""
    import gc

    gc.collect()
    platform.empty_cache()
