"""How ``brigade``'s parsers read flags: vLLM's dtype names (half, float), no abbreviated flags (a prefix is an
error naming the flag it may mean), while short and negated flags still parse."""

from __future__ import annotations

import argparse

import pytest
from cli_runner import assert_one_line, parse, run_cli, run_main


@pytest.mark.parametrize("alias,dtype", [("half", "float16"), ("float", "float32"), ("float16", "float16")])
def test_dtype_half_and_float_are_vllms_names(smollm2_path, alias, dtype):
    from brigade.entrypoints.cli.engine_args import config_from_args

    assert config_from_args(parse("serve", str(smollm2_path), "--dtype", alias)).model_config.dtype == dtype


def test_dtype_float_generates_and_a_bad_dtype_names_the_aliases(smollm2_path):
    proc = run_cli("generate", "The capital of France is", "--model", str(smollm2_path), "--dtype", "float",
                   "--max-tokens", "3", "--max-model-len", "64")
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    assert_one_line(run_main("serve", str(smollm2_path), "--dtype", "double"), "brigade serve",
                    "--dtype 'double' is not known; use one of auto, bfloat16, float16, float32 (or half for float16, "
                    "float for float32)")


def _all_parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_no_brigade_parser_takes_abbreviations():
    from brigade.entrypoints.cli.main import build_parser

    parsers = list(_all_parsers(build_parser({})))
    assert len(parsers) == 9  # brigade, serve, generate, chat, bench and its three, plugins
    assert [p.prog for p in parsers if p.allow_abbrev] == []


PREFIXES = [
    (["serve", "{model}", "--enable-prefix-cachin"], "brigade serve",
     "unrecognized arguments: --enable-prefix-cachin (did you mean --enable-prefix-caching?)"),
    (["serve", "{model}", "--max-model-le", "64"], "brigade serve",
     "unrecognized arguments: --max-model-le 64 (did you mean --max-model-len?)"),
    (["serve", "{model}", "--max_model_le=64"], "brigade serve",
     "unrecognized arguments: --max-model-le=64 (did you mean --max-model-len?)"),
    (["chat", "--max-tok", "5"], "brigade chat", "unrecognized arguments: --max-tok 5 (did you mean --max-tokens?)"),
    (["bench", "latency", "{model}", "--num-iter", "3"], "brigade bench latency",
     "unrecognized arguments: --num-iter 3 (did you mean --num-iters or --num-iters-warmup?)"),
    (["serve", "{model}", "--no-such-flag"], "brigade serve", "unrecognized arguments: --no-such-flag"),
    (["serve", "{model}", "--max-model-le", "64", "--enable-prefix-cachin"], "brigade serve",
     "(did you mean --max-model-len for --max-model-le, --enable-prefix-caching for --enable-prefix-cachin?)"),
]


def _prefix_error(run, smollm2_path, argv, prefix, needle):
    line = assert_one_line(run(*[a.format(model=smollm2_path) for a in argv]), prefix, needle)
    if "no-such-flag" in needle:
        assert "did you mean" not in line, line


@pytest.mark.parametrize("argv,prefix,needle", PREFIXES)
def test_a_prefix_of_a_flag_is_an_error_naming_it(smollm2_path, argv, prefix, needle):
    _prefix_error(run_main, smollm2_path, argv, prefix, needle)


def test_a_prefix_of_a_flag_is_the_commands_only_line(smollm2_path):
    """The same error from the ``brigade`` process (the underscore spelling normalized first)."""
    _prefix_error(run_cli, smollm2_path, *PREFIXES[2])


def test_short_and_negated_flags_still_parse(smollm2_path):
    args = parse("serve", str(smollm2_path), "-O0", "-tp", "1", "-q", "fp8", "--no-enable-prefix-caching",
                 "-cc", '{"cudagraph_mode": "NONE"}')
    assert (args.optimization_level, args.tensor_parallel_size, args.quantization) == (0, 1, "fp8")
    assert args.enable_prefix_caching is False and args.compilation_config == '{"cudagraph_mode": "NONE"}'
