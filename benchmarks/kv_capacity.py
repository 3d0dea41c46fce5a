"""How many sequences of one length the KV cache the engine allocates for a model holds at once: attention-shape
bench s3 (a hybrid model against the same model with every layer full) and s4's KV bytes held by windowed layers.

For each model, in a process of its own (one engine's device memory never counts against the next one's), start
brigade's ``LLM`` with the engine flags given (dummy weights, the same ``--gpu-memory-utilization`` or
``--kv-cache-memory`` for both), read the KV cache config the engine allocated (``KVCacheConfig``: ``num_blocks``
and the groups) and count, as vLLM v1's hybrid KV cache manager sizes its maximum concurrency:

    fit = (num_blocks - 1) // sum over groups of spec.max_blocks_per_request(seq_len, max_num_batched_tokens)

Block 0 is the pool's null block; a request holds at most that many blocks of each group at once (a
sliding-window group: its window plus one step's chunk of ``max_num_batched_tokens``), all from the one pool. The
same count "while decoding" takes a chunk of one token: what a sequence holds once its prompt is in. An engine
without KV cache groups (every layer keeps every block) reports one full-attention group of every layer
(``groups_source`` says which).

Writes one JSON object (``--json``) with each model's ``num_blocks``, ``groups`` (kind, layers, window, page
bytes, blocks and bytes one sequence holds at its peak and while decoding), ``fit`` and ``fit_decoding``, and with
``--against`` the ratios of the first model's counts over the second's.

Usage (on the CPU: a tiny config and ``--kv-cache-memory 0.05`` instead)::

    python benchmarks/kv_capacity.py benchmarks/configs/gemma-3-12b --against benchmarks/configs/gemma-3-12b-all-full \\
        --seq-len 8192 --json kv_capacity.json --load-format dummy --dtype bfloat16 --skip-tokenizer-init \\
        --max-model-len 8192 --max-num-batched-tokens 2048 --gpu-memory-utilization 0.9
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from brigade.interfaces.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheGroup, cdiv


def blocks_per_sequence(config: KVCacheConfig, seq_len: int, max_num_batched_tokens: int) -> int:
    """Block ids one sequence of ``seq_len`` tokens holds at most at once, every group together."""
    return sum(g.spec.max_blocks_per_request(seq_len, max_num_batched_tokens) for g in config.groups)


def sequences_that_fit(config: KVCacheConfig, seq_len: int, max_num_batched_tokens: int) -> int:
    """Sequences of ``seq_len`` tokens the pool holds at once, each at its peak (``num_blocks - 1`` usable)."""
    return (config.num_blocks - 1) // blocks_per_sequence(config, seq_len, max_num_batched_tokens)


def describe(config: KVCacheConfig, seq_len: int, max_num_batched_tokens: int) -> dict:
    """The JSON fields of one model (module docstring). Bytes: a group's blocks x its layers x page bytes."""
    groups = []
    for group in config.groups:
        spec, layers = group.spec, len(group.layer_ids)
        peak = spec.max_blocks_per_request(seq_len, max_num_batched_tokens)
        decoding = spec.max_blocks_per_request(seq_len, 1)
        groups.append({"kind": spec.kind, "layers": list(group.layer_ids),
                       "sliding_window": getattr(spec, "sliding_window", None), "block_size": spec.block_size,
                       "page_size_bytes": spec.page_size_bytes, "blocks_peak": peak, "blocks_decoding": decoding,
                       "bytes_peak": peak * layers * spec.page_size_bytes,
                       "bytes_decoding": decoding * layers * spec.page_size_bytes,
                       "bytes_if_full": cdiv(seq_len, spec.block_size) * layers * spec.page_size_bytes})
    return {"num_blocks": config.num_blocks, "num_tensors": config.num_tensors,
            "bytes_per_block": config.num_tensors * config.groups[0].spec.page_size_bytes,
            "seq_len": seq_len, "max_num_batched_tokens": max_num_batched_tokens, "groups": groups,
            "blocks_per_sequence": blocks_per_sequence(config, seq_len, max_num_batched_tokens),
            "blocks_per_sequence_decoding": blocks_per_sequence(config, seq_len, 1),
            "fit": sequences_that_fit(config, seq_len, max_num_batched_tokens),
            "fit_decoding": sequences_that_fit(config, seq_len, 1)}


def engine_kv_cache_config(llm) -> tuple[KVCacheConfig, str]:
    """The KV cache config ``llm``'s engine allocated, and where it was read.

    Raises:
        ValueError: an engine not in this process (data-parallel engines run in their own).
    """
    core = llm.engine.core
    if not hasattr(core, "executor"):
        raise ValueError("kv_capacity reads an in-process engine core: run it with --data-parallel-size 1")
    config = getattr(core, "kv_cache_config", None)
    if isinstance(config, KVCacheConfig):
        return config, "engine_core.kv_cache_config"
    runner = getattr(getattr(core.executor, "worker", None), "model_runner", None)
    config = getattr(runner, "kv_cache_config", None)
    if isinstance(config, KVCacheConfig):
        return config, "model_runner.kv_cache_config"
    # No KV cache groups in this engine: one tensor per layer, every block held for the whole context.
    cache = runner.kv_cache
    layers = range(cache.num_layers) if cache.layers is None else cache.layers
    spec = FullAttentionSpec(cache.block_size, cache.num_kv_heads, cache.head_size,
                             str(cache.storage_dtype).removeprefix("torch."))
    return KVCacheConfig(core.num_blocks, (KVCacheGroup(spec, tuple(layers)),)), "engine without KV cache groups"


def probe(engine_argv: list[str], seq_len: int) -> dict:
    """Start the engine on ``engine_argv`` (a model then engine flags), read its KV cache config, describe it."""
    from brigade.entrypoints.cli.engine_args import add_engine_args, runnable_config_from_args
    from brigade.entrypoints.cli.start_engine import start_llm
    from brigade.plugins import load_plugins, plugin_choices

    load_plugins("api")
    parser = argparse.ArgumentParser(prog="kv_capacity.py --probe")
    add_engine_args(parser, plugin_choices())
    engine_config = runnable_config_from_args(parser.parse_args(engine_argv))
    llm = start_llm(engine_config)
    try:
        config, source = engine_kv_cache_config(llm)
        budget = llm.config.scheduler_config.max_num_batched_tokens
        return {"model": engine_config.model_config.model, "max_model_len": llm.config.model_config.max_model_len,
                "groups_source": source, **describe(config, seq_len, budget)}
    finally:
        llm.shutdown()


def _run_probe(model: str, engine_flags: list[str], seq_len: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--probe", "--seq-len", str(seq_len), model, *engine_flags],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the engine on {model} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/kv_capacity.py", description=__doc__.split("\n")[0],
                                     allow_abbrev=False,
                                     epilog="Other flags are engine flags (brigade serve's), given to every engine.")
    parser.add_argument("model", help="a model directory (config.json; --load-format dummy needs no weights)")
    parser.add_argument("--against", default=None, help="a second model; the JSON gets model / against ratios")
    parser.add_argument("--seq-len", type=int, default=8192, help="tokens a sequence holds (default %(default)s)")
    parser.add_argument("--json", default=None, help="also write the JSON object to this path")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # one engine, here
    args, engine_flags = parser.parse_known_args(argv)
    if args.seq_len < 1:
        parser.error(f"--seq-len must be at least 1, got {args.seq_len}")
    if args.probe:
        print(json.dumps(probe([args.model, *engine_flags], args.seq_len)))
        return 0
    result = {"seq_len": args.seq_len, "engine_flags": engine_flags,
              "models": [_run_probe(args.model, engine_flags, args.seq_len)]}
    if args.against:
        result["models"].append(_run_probe(args.against, engine_flags, args.seq_len))
        first, second = result["models"]
        result["ratio"] = first["fit"] / second["fit"] if second["fit"] else None
        result["ratio_decoding"] = first["fit_decoding"] / second["fit_decoding"] if second["fit_decoding"] else None
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
