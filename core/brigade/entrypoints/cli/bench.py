"""``brigade bench {throughput,latency,serve}``: vLLM-style benchmarks with an HF transformers peer.

Each subcommand takes the engine flags of ``brigade serve`` (``add_engine_args``), prints a table and
writes one JSON record (brigade.benchmarks.results) to ``--output-json``, or else under the cache directory
(``$BRIGADE_CACHE_DIR/bench/``, default ``~/.cache/brigade/bench/``).
docs/benchmarks.md gives the commands and measured numbers.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from urllib.parse import urlparse

from brigade.benchmarks.datasets import DATASETS
from brigade.entrypoints.cli.arg_types import http_url
from brigade.entrypoints.cli.arg_types import non_negative_int as _non_negative_int
from brigade.entrypoints.cli.arg_types import positive_int as _positive_int

# --hf-peer: which HF transformers runs ``bench throughput`` measures beside Brigade (brigade.benchmarks.hf_peer).
# Spelt here, not imported from hf_peer, so that building the parser does not import torch.
PEER_MODES = ("none", "generate", "generate_batch", "both")
LATENCY_ITERATIONS = (10, 30)  # bench latency's (warm-up, timed) batches on an accelerator, as in vLLM
LATENCY_ITERATIONS_CPU = (1, 3)  # on the CPU a batch of the default sizes takes seconds, not milliseconds


class _ActionRecorder:
    """Stands in for a parser while ``add_engine_args`` runs, keeping the argparse Actions it creates,
    so ``bench serve --launch`` can hand the same engine flags to ``brigade serve``."""

    def __init__(self, target, actions: list[argparse.Action]):
        self._target = target
        self.actions = actions

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = self._target.add_argument(*args, **kwargs)
        self.actions.append(action)
        return action

    def add_argument_group(self, *args, **kwargs) -> _ActionRecorder:
        return _ActionRecorder(self._target.add_argument_group(*args, **kwargs), self.actions)

    def set_defaults(self, **kwargs) -> None:
        self._target.set_defaults(**kwargs)


def engine_argv(args: argparse.Namespace, actions: Sequence[argparse.Action]) -> list[str]:
    """The command-line flags that reproduce the engine flags of ``args`` that differ from their defaults."""
    argv: list[str] = []
    for action in actions:
        value = getattr(args, action.dest, action.default)
        if value is None or value == action.default:
            continue
        if not action.option_strings:
            argv.insert(0, str(value))  # the positional MODEL
        elif isinstance(action, argparse.BooleanOptionalAction):
            flag = action.option_strings[0]
            argv.append(flag if value else "--no-" + flag[2:])
        elif action.nargs == 0:
            argv.append(action.option_strings[-1])
        elif isinstance(value, list):  # a flag taking several values (--served-model-name, --lora-modules)
            argv += [max(action.option_strings, key=len), *map(str, value)]
        else:
            argv += [max(action.option_strings, key=len), str(value)]
    return argv


def _add_engine_args(parser: argparse.ArgumentParser, plugin_choices) -> None:
    from brigade.entrypoints.cli.engine_args import add_engine_args

    actions: list[argparse.Action] = []
    add_engine_args(_ActionRecorder(parser, actions), plugin_choices)
    parser.set_defaults(bench_engine_actions=actions)


def _positive_float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:  # also refuses nan and -inf
        raise argparse.ArgumentTypeError(f"must be a positive number of {what}, got {text!r}")
    return value


def _rate(text: str) -> float:
    """argparse type: requests/s, positive or inf."""
    return _positive_float(text, "requests/s or inf")


def _seconds(text: str) -> float:
    """argparse type: a positive number of seconds."""
    return _positive_float(text, "seconds")


def _fraction(text: str) -> float:
    """argparse type: a share in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a share between 0 and 1, e.g. 0.1, got {text!r}")
    return value


def _penalty(text: str) -> float:
    """argparse type: a repetition penalty (positive; 1 is none)."""
    return _positive_float(text, "(1 is no penalty)")


def _base_url(text: str) -> str:
    """argparse type: the server's root URL, ``http(s)://HOST[:PORT]``. A trailing ``/v1`` (the usual OpenAI
    base URL) is dropped, as the benchmark adds ``/v1/...`` itself; any other path is refused."""
    expected = "give http(s)://HOST:PORT, e.g. http://127.0.0.1:8000"
    url = http_url(text, expected)
    if url.path.rstrip("/") not in ("", "/v1") or url.query or url.fragment or url.params:
        raise argparse.ArgumentTypeError(f"{text!r} has a path; {expected} (a trailing /v1 is accepted too)")
    return f"{url.scheme}://{url.netloc}"


def _port(text: str) -> int:
    """argparse type: a TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 1..65535, got {text}")
    return value


class _GivenBaseURL(argparse._StoreAction):
    """``--base-url``'s store action; notes that it was given, so ``--host``/``--port`` next to it are refused."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        super().__call__(parser, namespace, values, option_string)
        namespace.base_url_given = True


def resolve_base_url(args: argparse.Namespace) -> None:
    """``bench serve``: set ``args.base_url`` from ``--host``/``--port`` when given (vLLM's bench serve builds
    ``http://HOST:PORT`` from them when --base-url is not given; defaults 127.0.0.1 and 8000).

    Raises:
        ConfigError: --base-url given as well, or a host that makes no URL.
    """
    from brigade.config import ConfigError

    if args.host is None and args.port is None:
        return
    if getattr(args, "base_url_given", False):
        raise ConfigError("--base-url and --host/--port both name the server; give one")
    host = args.host or "127.0.0.1"
    try:
        args.base_url = _base_url(f"http://{f'[{host}]' if ':' in host else host}:{args.port or 8000}")
    except argparse.ArgumentTypeError:
        raise ConfigError(f"--host {host!r} is not a host name or address, e.g. 127.0.0.1") from None


def add_parser(subparsers, plugin_choices: Mapping[str, Sequence[str]] | None = None) -> argparse.ArgumentParser:
    """Add ``bench`` and its three sub-subcommands (each sets ``run``) to ``subparsers``."""
    parser = subparsers.add_parser("bench", help="benchmark throughput, latency or a server", allow_abbrev=False,
                                   description="Benchmark Brigade (vLLM's bench conventions) against HF transformers.")
    parser.set_defaults(run=lambda args: (parser.print_help(), 2)[1])
    commands = parser.add_subparsers(dest="bench_command", metavar="{throughput,latency,serve}")

    _add_throughput_parser(commands, plugin_choices)
    _add_latency_parser(commands, plugin_choices)
    _add_serve_parser(commands, plugin_choices)
    return parser


def _add_throughput_parser(commands, plugin_choices: Mapping[str, Sequence[str]] | None) -> None:
    """``bench throughput``: offline throughput of the LLM class, optionally HF transformers beside it."""
    t = commands.add_parser("throughput", help="offline throughput of a request set submitted at once",
                            allow_abbrev=False,
                            description="Offline throughput (requests/s, output and total tokens/s) of the LLM "
                                        "class, with ignore_eos; optionally HF transformers in the same process.")
    _add_dataset_args(t, input_len=1024, output_len=128, num_prompts=1000)
    t.add_argument("--hf-peer", choices=PEER_MODES, default="none",
                   help="also run HF transformers: generate (static padded batches), generate_batch "
                        "(its continuous batching), or both")
    t.add_argument("--hf-batch-size", type=_positive_int, default=None,
                   help="prompts per HF generate batch (default: all of them in one batch)")
    t.add_argument("--repeats", type=_positive_int, default=1,
                   help="alternate Brigade and the peers for this many rounds (fresh prompts each) and report "
                        "medians; both stay loaded, so on a GPU lower --gpu-memory-utilization (default 1)")
    t.add_argument("--repetition-penalty-fraction", type=_fraction, default=0.0, metavar="FRACTION",
                   help="share of Brigade's requests that sample with --repetition-penalty, spread evenly over the "
                        "set (default 0): what one request's penalty costs the whole batch")
    t.add_argument("--repetition-penalty", type=_penalty, default=1.1,
                   help="the penalty those requests use (default %(default)s)")
    _add_output_args(t)
    _add_engine_args(t, plugin_choices)
    t.set_defaults(run=_one_line_config_errors(_run_throughput, t))



def _add_latency_parser(commands, plugin_choices: Mapping[str, Sequence[str]] | None) -> None:
    """``bench latency``: latency, TTFT and TPOT of one batch, optionally HF generate on the same batches."""
    lat = commands.add_parser("latency", help="latency, TTFT and TPOT of one batch", allow_abbrev=False,
                              description="End-to-end latency, TTFT and TPOT of one batch of random prompts.")
    lat.add_argument("--batch-size", type=_positive_int, default=8, help="prompts per batch (default %(default)s)")
    lat.add_argument("--input-len", type=_positive_int, default=32,
                     help="random prompt tokens per request (default %(default)s)")
    lat.add_argument("--output-len", type=_positive_int, default=128,
                     help="tokens generated per request, ignoring EOS (default %(default)s)")
    (warmup, timed), (cpu_warmup, cpu_timed) = LATENCY_ITERATIONS, LATENCY_ITERATIONS_CPU
    lat.add_argument("--num-iters-warmup", type=_non_negative_int, default=None,
                     help=f"untimed batches first (default {warmup}; {cpu_warmup} on the CPU)")
    lat.add_argument("--num-iters", type=_positive_int, default=None,
                     help=f"timed batches; the report gives mean, median and p99 over them (default {timed}; "
                          f"{cpu_timed} on the CPU)")
    lat.add_argument("--hf-peer", choices=("none", "generate"), default="none",
                     help="also time HF generate on the same batches")
    _add_output_args(lat)
    _add_engine_args(lat, plugin_choices)
    lat.set_defaults(run=_one_line_config_errors(_run_latency, lat))



def _add_serve_parser(commands, plugin_choices: Mapping[str, Sequence[str]] | None) -> None:
    """``bench serve``: Poisson arrivals of streaming completions against a server (or one it launches)."""
    s = commands.add_parser("serve", help="online serving: Poisson arrivals of streaming completions",
                            allow_abbrev=False,
                            description="Streaming /v1/completions with token-id prompts and ignore_eos against "
                                        "--base-url (or --host and --port), or a server started with --launch and the "
                                        "engine flags.")
    _add_dataset_args(s, input_len=1024, output_len=128, num_prompts=1000)
    s.add_argument("--base-url", type=_base_url, default="http://127.0.0.1:8000", action=_GivenBaseURL,
                   help="the server's root URL; a trailing /v1 is dropped (default: http://HOST:PORT of --host and "
                        "--port)")
    s.add_argument("--host", default=None, help="the server's host when --base-url is not given (default 127.0.0.1)")
    s.add_argument("--port", type=_port, default=None, help="the server's port when --base-url is not given "
                                                            "(default 8000)")
    s.add_argument("--launch", action="store_true",
                   help="start `brigade serve` with the engine flags at the server's host and port, then stop it")
    s.add_argument("--launch-timeout", type=_seconds, default=600.0,
                   help="seconds to wait for the launched server (default %(default)s)")
    s.add_argument("--request-rate", type=_rate, default=float("inf"),
                   help="mean arrivals per second of a Poisson process; inf sends all at once (default)")
    s.add_argument("--max-concurrency", type=_positive_int, default=None, help="most requests in flight")
    s.add_argument("--api-key", default=None, help="Bearer key for /v1 (default: $BRIGADE_API_KEY)")
    _add_output_args(s)
    _add_engine_args(s, plugin_choices)
    s.set_defaults(run=_one_line_config_errors(_run_serve, s))


def _add_dataset_args(parser: argparse.ArgumentParser, *, input_len: int, output_len: int, num_prompts: int) -> None:
    d = parser.add_argument_group("dataset")
    d.add_argument("--dataset", choices=DATASETS, default="random",
                   help="random: fixed lengths; sharegpt-like: seeded lognormal lengths, mean ~200 in / ~180 out")
    d.add_argument("--input-len", type=_positive_int, default=None,
                   help=f"prompt tokens, --dataset random only (default {input_len})")
    d.add_argument("--output-len", type=_positive_int, default=None,
                   help=f"output tokens, --dataset random only (default {output_len})")
    parser.set_defaults(random_lengths_default=(input_len, output_len))
    d.add_argument("--num-prompts", type=_positive_int, default=num_prompts,
                   help="requests in the set (default %(default)s)")


def _add_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-json", default=None,
                        help="where to write the JSON record (default: $BRIGADE_CACHE_DIR/bench/<timestamp>-<kind>.json, "
                             "$BRIGADE_CACHE_DIR defaulting to ~/.cache/brigade)")


def _one_line_config_errors(run, parser: argparse.ArgumentParser):
    """``run``, with a ConfigError printed as one line in the name of the subcommand that got the flags
    (``brigade bench latency: error: ...``, exit 2), as for a bad flag, rather than of ``bench``; an engine or a
    server that failed to start likewise, exit 1."""

    def guarded(args: argparse.Namespace) -> int:
        from brigade.config import ConfigError

        from brigade.benchmarks.launcher import ServerStartError
        from brigade.benchmarks.serve import ServerUnusableError
        from brigade.entrypoints.cli.start_engine import is_engine_startup_error

        try:
            return run(args)
        except (ConfigError, ServerStartError, ServerUnusableError) as exc:
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ConfigError) else 1  # a flag, or the server (status 1)
        except Exception as exc:
            if not is_engine_startup_error(exc):
                raise
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return 1

    return guarded


def resolve_dataset_lengths(args: argparse.Namespace) -> None:
    """``--input-len``/``--output-len`` apply to ``--dataset random`` only: fill in their defaults there, and
    refuse them with another dataset (its lengths come from the dataset; they would be silently ignored).

    Raises:
        ConfigError: a length given with a dataset other than random.
    """
    from brigade.config import ConfigError

    given = [flag for flag, value in (("--input-len", args.input_len), ("--output-len", args.output_len))
             if value is not None]
    if args.dataset != "random":
        if given:
            raise ConfigError(f"{' and '.join(given)} apply to --dataset random only; --dataset {args.dataset} "
                              f"draws its own lengths: drop {' and '.join(given)}, or use --dataset random")
        return
    default_in, default_out = args.random_lengths_default
    args.input_len = default_in if args.input_len is None else args.input_len
    args.output_len = default_out if args.output_len is None else args.output_len


def _run_throughput(args: argparse.Namespace) -> int:
    from brigade.benchmarks.commands import run_throughput

    resolve_dataset_lengths(args)
    return run_throughput(args)


def resolve_latency_iterations(args: argparse.Namespace, device_type: str) -> None:
    """Fill in ``--num-iters-warmup`` and ``--num-iters`` not given, sized for ``device_type``'s speed."""
    warmup, timed = LATENCY_ITERATIONS_CPU if device_type == "cpu" else LATENCY_ITERATIONS
    args.num_iters_warmup = warmup if args.num_iters_warmup is None else args.num_iters_warmup
    args.num_iters = timed if args.num_iters is None else args.num_iters


def _run_latency(args: argparse.Namespace) -> int:
    from brigade.benchmarks.commands import run_latency

    return run_latency(args)


def _run_serve(args: argparse.Namespace) -> int:
    from brigade.benchmarks.commands import run_serve
    from brigade.config import ConfigError

    resolve_dataset_lengths(args)
    resolve_base_url(args)
    if args.launch and urlparse(args.base_url).scheme != "http":
        raise ConfigError(f"--launch starts a plain-HTTP server; give an http:// --base-url, not {args.base_url!r}")
    return run_serve(args, engine_argv(args, args.bench_engine_actions))
