"""``bench serve --launch`` hands its engine flags to ``brigade serve``: they must parse back the same."""

from __future__ import annotations

from brigade.entrypoints.cli.bench import engine_argv
from brigade.entrypoints.cli.main import build_parser
from brigade.plugins import load_plugins, plugin_choices


def test_engine_flags_round_trip_into_brigade_serve():
    load_plugins("api")
    parser = build_parser(plugin_choices())
    bench = parser.parse_args(["bench", "serve", "/models/m", "--launch", "--num-prompts", "3", "--dtype", "bfloat16",
                               "--no-enable-prefix-caching", "-O", "1", "--enforce-eager", "--max-num-seqs", "4",
                               "--kv-cache-memory", "0.5", "-tp", "2", "--tokenizer", "/tok",
                               "--served-model-name", "a", "b", "--enable-lora", "--lora-modules", "x=/p", "y=/q"])
    argv = engine_argv(bench, bench.bench_engine_actions)
    assert argv[0] == "/models/m" and "--launch" not in argv and "--num-prompts" not in argv
    assert argv[argv.index("--served-model-name") + 1:][:2] == ["a", "b"]  # each value, not a list's repr
    serve = parser.parse_args(["serve", *argv])
    for dest in ("model_tag", "dtype", "enable_prefix_caching", "optimization_level", "enforce_eager",
                 "max_num_seqs", "kv_cache_memory_gib", "tensor_parallel_size", "tokenizer", "load_format",
                 "block_size", "gpu_memory_utilization", "served_model_name", "enable_lora", "lora_modules"):
        assert getattr(serve, dest) == getattr(bench, dest), dest
    assert engine_argv(parser.parse_args(["bench", "serve"]), bench.bench_engine_actions) == []
