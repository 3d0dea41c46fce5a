"""The three ``brigade bench`` runs: build the engine and the request set, time Brigade, then the HF peer.

Brigade runs first and is shut down (its KV cache freed) before the HF model is loaded, so on a GPU
the peer gets the memory back; both run in this process with the same prompts and thread count.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import math
from dataclasses import dataclass
from urllib.parse import urlparse

import torch

from brigade import envs
from brigade.benchmarks import results as rec
from brigade.benchmarks.comparison import release_memory
from brigade.benchmarks.datasets import make_requests, prompt_vocab_size, random_requests, token_counts
from brigade.benchmarks.serve import run_serve_benchmark, serve_metrics
from brigade.config import ConfigError

_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": "off", "ignore_eos": True}


def _platform():
    from brigade.plugins import current_platform, load_plugins

    load_plugins("engine")
    return current_platform()


def _model_dtype(platform, config, hf_config) -> torch.dtype:
    """The dtype the engine's worker picks for this model (same rule), used for the HF peer too."""
    # "dtype" first: reading "torch_dtype" warns (deprecated) in transformers 5.
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype, None)
    return platform.resolve_dtype(config.model_config.dtype, config_dtype)


def _free_device_memory(platform) -> int | None:
    """Free device memory in bytes (None on the CPU), noted before the HF peer loads: if Brigade's KV
    cache or CUDA graphs were not released, the record shows it."""
    try:
        return platform.mem_get_info()[0]
    except NotImplementedError:
        return None


def _print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"=== {title} ===")
    for row in [header, *rows]:
        cells = [str(cell).rjust(w) if i else str(cell).ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        print("  ".join(cells))


def _finish(record: dict, path: str | None) -> int:
    written = rec.write_record(record, path)
    print(f"results written to {written}")
    return 0


def check_lengths_before_loading(args: argparse.Namespace, config) -> None:
    """Refuse a random request set longer than the model takes before any engine is built (the model's
    max_position_embeddings from its config.json, or ``--max-model-len``, as the engine resolves it).

    Raises:
        ConfigError: one line naming the lengths and the limit.
    """
    import copy

    from brigade.benchmarks.datasets import check_random_lengths
    from brigade.model_executor.loader import get_hf_config

    if getattr(args, "dataset", "random") != "random":  # sharegpt-like requests are cut to fit
        return
    resolved = copy.deepcopy(config)
    hf_config = get_hf_config(config.model_config.model, config.model_config.trust_remote_code)
    resolved.resolve(hf_config)
    source = "--max-model-len" if config.model_config.max_model_len is not None else \
        "the model's max_position_embeddings"
    check_random_lengths(args.input_len, args.output_len, resolved.model_config.max_model_len, source)


def _used_lengths(args: argparse.Namespace) -> dict[str, int]:
    """``input_len``/``output_len`` for the record when the dataset used them (random); nothing otherwise."""
    if args.dataset != "random":
        return {}
    return {"input_len": args.input_len, "output_len": args.output_len}


# ---- throughput --------------------------------------------------------------------------------------

def run_throughput(args: argparse.Namespace) -> int:
    """``brigade bench throughput``; returns the exit status."""
    from brigade.benchmarks.comparison import run_comparison
    from brigade.benchmarks.hf_peer import load_hf_model
    from brigade.entrypoints.cli.engine_args import runnable_config_from_args

    config = runnable_config_from_args(args)  # ConfigError: one line from the CLI's main, before the model loads
    check_lengths_before_loading(args, config)
    platform = _platform()
    seed = 0 if args.seed is None else args.seed
    setup: dict[str, object] = {}

    def load_peer_model(hf_config):
        setup["device_memory_free_before_load_bytes"] = _free_device_memory(platform)
        return load_hf_model(config.model_config.model, dtype=_model_dtype(platform, config, hf_config),
                             device=platform.device_for_rank(0), load_format=config.model_config.load_format,
                             seed=seed, trust_remote_code=config.model_config.trust_remote_code)

    comparison = run_comparison(config, args, platform, seed, load_peer_model=load_peer_model)
    release_memory(platform)
    results, ratios, requests = comparison.results, comparison.ratios, comparison.requests
    if setup:
        results["hf_setup"] = setup
    num_prompt, num_output = token_counts(requests)
    rows = [[name, f"{v['elapsed_s']:.2f}", f"{v['cpu_time_s']:.2f}", f"{v['requests_per_s']:.2f}",
             f"{v['output_tokens_per_s']:.1f}", f"{v['total_tokens_per_s']:.1f}"]
            for name, v in results.items() if "elapsed_s" in v]
    median = f", median of {args.repeats} interleaved rounds" if args.repeats > 1 else ""
    _print_table(f"throughput: {args.dataset}, {len(requests)} prompts, {num_prompt} prompt / {num_output} output "
                 f"tokens{median}", ["", "elapsed s", "cpu s", "req/s", "output tok/s", "total tok/s"], rows)
    for key, value in ratios.items():
        if key.endswith("output_tokens_per_s") and value is not None:
            print(f"{key.removesuffix('/output_tokens_per_s')} output tok/s ratio: {value:.2f}x")
    bench = {"dataset": args.dataset, **_used_lengths(args),
             "num_prompts": args.num_prompts, "seed": seed, "num_prompt_tokens": num_prompt,
             "num_output_tokens": num_output, "sampling": _SAMPLING, "hf_peer": args.hf_peer,
             "hf_batch_size": args.hf_batch_size or len(requests), "repeats": args.repeats,
             "repetition_penalty_fraction": args.repetition_penalty_fraction,
             "repetition_penalty": args.repetition_penalty if args.repetition_penalty_fraction else None,
             "warmup": "2 short requests, untimed"}
    record = rec.build_record("throughput", device=rec.device_info(platform.device_type, platform.name),
                              benchmark_config=bench, engine_config=comparison.engine_config, results=results,
                              ratios=ratios)
    return _finish(record, args.output_json)


# ---- latency -----------------------------------------------------------------------------------------

def run_latency(args: argparse.Namespace) -> int:
    """``brigade bench latency``; returns the exit status."""
    from brigade.benchmarks.latency import BrigadeLatencyRunner, latency_summary, run_iterations
    from brigade.entrypoints.cli.bench import resolve_latency_iterations
    from brigade.entrypoints.cli.engine_args import runnable_config_from_args
    from brigade.entrypoints.cli.start_engine import start_llm
    from brigade.model_executor.loader import get_hf_config

    config = runnable_config_from_args(args)  # ConfigError: one line from the CLI's main, before the model loads
    check_lengths_before_loading(args, config)
    platform = _platform()
    resolve_latency_iterations(args, platform.device_type)
    seed = 0 if args.seed is None else args.seed
    hf_config = get_hf_config(config.model_config.model, config.model_config.trust_remote_code)
    llm = start_llm(config)
    engine_config = llm.config
    try:
        runner = BrigadeLatencyRunner(llm.engine, platform.synchronize)
        vocab = prompt_vocab_size(hf_config.vocab_size, llm.get_tokenizer())
        make = _latency_batches(args, vocab, seed)
        timed = run_iterations(lambda: runner.run_batch(make()), num_warmup=args.num_iters_warmup,
                               num_iters=args.num_iters, on_iteration=_report_iteration)
    finally:
        llm.engine.core.shutdown()
    del llm, runner
    release_memory(platform)
    results = {"brigade": {**latency_summary(timed, args.output_len), "load_average_after": rec.load_average()}}
    if args.hf_peer == "generate":
        results["hf_generate"] = _hf_latency(args, config, platform, hf_config, _latency_batches(args, vocab, seed),
                                             seed)
    _print_latency_table(args, results)
    ratios = {f"{peer}/brigade/{m}": rec.ratio(v[m]["mean"], results["brigade"][m]["mean"])
              for peer, v in results.items() if peer != "brigade" for m in ("latency_ms", "ttft_ms", "tpot_ms")}
    bench = {"batch_size": args.batch_size, "input_len": args.input_len, "output_len": args.output_len,
             "num_iters_warmup": args.num_iters_warmup, "num_iters": args.num_iters, "seed": seed,
             "sampling": _SAMPLING, "hf_peer": args.hf_peer,
             "ttft_method": "end of the engine step (Brigade) / generate streamer put (HF) that produced the "
                            "first token, device synchronized; TPOT = (e2e - TTFT) / (output_len - 1)"}
    record = rec.build_record("latency", device=rec.device_info(platform.device_type, platform.name),
                              benchmark_config=bench, engine_config=engine_config, results=results, ratios=ratios)
    return _finish(record, args.output_json)


def _latency_batches(args: argparse.Namespace, vocab: int, seed: int):
    """A maker of the timed batches: iteration k draws its random prompts with ``seed + k`` (fresh prompts, no
    prefix-cache hits), so two makers give Brigade and the peer the same batches."""
    counter = itertools.count()
    return lambda: random_requests(args.batch_size, args.input_len, args.output_len, vocab_size=vocab,
                                   seed=seed + next(counter))


def _report_iteration(phase: str, i: int, timing) -> None:
    print(f"{phase} iteration {i + 1}: {timing.latency_s * 1000:.1f} ms", flush=True)


def _hf_latency(args: argparse.Namespace, config, platform, hf_config, make_batch, seed: int) -> dict:
    """HF generate timed on the same batches as Brigade (loaded after Brigade freed its memory)."""
    from brigade.benchmarks.hf_peer import load_hf_model
    from brigade.benchmarks.latency import hf_latency_batch, latency_summary, run_iterations

    model = load_hf_model(config.model_config.model, dtype=_model_dtype(platform, config, hf_config),
                          device=platform.device_for_rank(0), load_format=config.model_config.load_format,
                          seed=seed, trust_remote_code=config.model_config.trust_remote_code)
    timed = run_iterations(lambda: hf_latency_batch(model, make_batch(), synchronize=platform.synchronize),
                           num_warmup=args.num_iters_warmup, num_iters=args.num_iters, on_iteration=_report_iteration)
    summary = {**latency_summary(timed, args.output_len), "load_average_after": rec.load_average()}
    del model
    release_memory(platform)
    return summary


def _print_latency_table(args: argparse.Namespace, results: dict) -> None:
    rows = [[name] + [f"{v[m][s]:.2f}" for m in ("latency_ms", "ttft_ms", "tpot_ms") for s in ("mean", "median", "p99")]
            for name, v in results.items()]
    header = [""] + [f"{m} {s}" for m in ("latency", "ttft", "tpot") for s in ("mean", "median", "p99")]
    _print_table(f"latency (ms): batch {args.batch_size}, {args.input_len} in / {args.output_len} out, "
                 f"{args.num_iters} iterations", header, rows)


# ---- serve -------------------------------------------------------------------------------------------

def _server_facts(base_url: str, api_key: str | None,
                  served_name: str | list[str] | None) -> tuple[str, str | None]:
    """(the model name to send, the server's /version), asking /v1/models when no name was given."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    version = None
    try:
        resp = httpx.get(base_url.rstrip("/") + "/version", timeout=10.0)
    except httpx.TransportError as exc:
        raise ConfigError(f"cannot reach a server at {base_url} ({type(exc).__name__}: {exc}); start `brigade "
                          "serve` there first, or pass --launch to start one with this command's engine flags") \
            from None
    if resp.status_code == 200:
        version = resp.json().get("version")
    if isinstance(served_name, list):  # --served-model-name takes several names; requests use the first
        served_name = served_name[0] if served_name else None
    if served_name:
        return served_name, version
    resp = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=10.0)
    if resp.status_code in (401, 403):
        raise ConfigError(f"the server at {base_url} refused GET /v1/models ({resp.status_code}); pass its key "
                          "with --api-key or $BRIGADE_API_KEY")
    try:
        resp.raise_for_status()
        return resp.json()["data"][0]["id"], version
    except (httpx.HTTPStatusError, ValueError, KeyError, IndexError, TypeError):
        raise ConfigError(f"GET {base_url}/v1/models gave no model (HTTP {resp.status_code}); is --base-url an "
                          "OpenAI-compatible server? Or name the model with --served-model-name") from None


def run_serve(args: argparse.Namespace, serve_engine_argv: list[str]) -> int:
    """``brigade bench serve``; ``serve_engine_argv`` are the engine flags to launch the server with."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    seed = 0 if args.seed is None else args.seed
    requests = _serve_requests(args, seed)
    api_key = args.api_key or envs.BRIGADE_API_KEY or None
    run = _serve_run(args, serve_engine_argv, requests, api_key, seed)
    metrics = {**serve_metrics(run.results, run.duration_s), "load_average_after": rec.load_average()}
    rows = [[name] + [f"{metrics[name][s]:.2f}" for s in ("mean", "median", "p99")]
            for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")]
    _print_table(f"serve: {metrics['completed']}/{metrics['num_requests']} requests in {run.duration_s:.2f} s, "
                 f"{metrics['requests_per_s']:.2f} req/s, {metrics['output_tokens_per_s']:.1f} output tok/s, "
                 f"{metrics['total_tokens_per_s']:.1f} total tok/s", ["", "mean", "median", "p99"], rows)
    num_prompt, num_output = token_counts(requests)
    bench = {"dataset": args.dataset, **_used_lengths(args),
             "num_prompts": args.num_prompts, "seed": seed,
             "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
             "max_concurrency": args.max_concurrency, "num_prompt_tokens": num_prompt, "num_output_tokens": num_output,
             "sampling": _SAMPLING, "base_url": args.base_url, "launched": args.launch, "model_name": run.model_name,
             "server_version": run.server_version}
    if args.launch:  # the server ran on this machine's platform
        platform = _platform()
        device = rec.device_info(platform.device_type, platform.name)
    else:  # a client only: no plugin, no platform (the server's device is its own)
        device = rec.device_info("remote", "the server at --base-url")
    record = rec.build_record("serve", device=device,
                              benchmark_config=bench, engine_config=run.engine_config, results={"brigade": metrics})
    status = _finish(record, args.output_json)
    return status if metrics["failed"] == 0 else 1


def _serve_requests(args: argparse.Namespace, seed: int) -> list:
    """The request set of ``bench serve``: token-id prompts over the model's vocabulary (its config.json, and its
    tokenizer unless ``--skip-tokenizer-init``), cut to the model's length for sharegpt-like."""
    from brigade.entrypoints.cli.engine_args import check_tokenizer_dir, model_path
    from brigade.model_executor.loader import get_hf_config

    model_dir = model_path(args)  # its config.json gives the vocabulary of the token-id prompts
    if args.tokenizer is not None and not args.skip_tokenizer_init:
        check_tokenizer_dir(args.tokenizer)
    hf_config = get_hf_config(model_dir, args.trust_remote_code)
    max_len = args.max_model_len or getattr(hf_config, "max_position_embeddings", None)
    tokenizer = None
    if not args.skip_tokenizer_init:
        from brigade.config import ModelConfig
        from brigade.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(ModelConfig(model=model_dir, tokenizer=args.tokenizer,
                                              trust_remote_code=args.trust_remote_code))
    return make_requests(args.dataset, args.num_prompts, input_len=args.input_len, output_len=args.output_len,
                         vocab_size=prompt_vocab_size(hf_config.vocab_size, tokenizer), seed=seed, max_model_len=max_len)


@dataclass
class ServeRun:
    """What one ``bench serve`` run against a server measured, and which server it was."""

    results: list  # RequestResult per request, in order
    duration_s: float
    model_name: str
    server_version: str | None
    engine_config: object  # the launched server's BrigadeConfig, or {"launched": False, "base_url": ...}


def _serve_run(args: argparse.Namespace, serve_engine_argv: list[str], requests: list, api_key: str | None,
               seed: int) -> ServeRun:
    """Send ``requests`` to the server at ``--base-url``, first starting one with the engine flags (``--launch``)
    and stopping it after."""
    from brigade.benchmarks.launcher import ServerProcess

    def measure(engine_config: object) -> ServeRun:
        model_name, version = _server_facts(args.base_url, api_key, args.served_model_name)
        results, duration = asyncio.run(run_serve_benchmark(
            args.base_url, model_name, requests, request_rate=args.request_rate, seed=seed, api_key=api_key,
            max_concurrency=args.max_concurrency))
        return ServeRun(results, duration, model_name, version, engine_config)

    if not args.launch:
        return measure({"launched": False, "base_url": args.base_url})
    from brigade.entrypoints.cli.engine_args import runnable_config_from_args

    engine_config = runnable_config_from_args(args)  # validates the flags before a server is started
    url = urlparse(args.base_url)
    argv = [*serve_engine_argv, "--host", url.hostname, "--port", str(url.port or 80),
            "--disable-log-requests", "--uvicorn-log-level", "warning"]
    if api_key:
        argv += ["--api-key", api_key]
    print(f"launching: brigade serve {' '.join(argv)}", flush=True)
    with ServerProcess(argv, args.base_url, startup_timeout_s=args.launch_timeout) as server:
        run = measure(engine_config)
        print(f"server log: {server.log_path}")
    return run
