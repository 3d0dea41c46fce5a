"""``brigade serve MODEL``: start the OpenAI-compatible server (flags as in ``vllm serve``; docs/server.md)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import math
import sys
from collections.abc import Mapping, Sequence

from brigade import envs
from brigade.config import ConfigError
from brigade.entrypoints.cli.engine_args import add_engine_args, runnable_config_from_args

API_KEY_ENV = "BRIGADE_API_KEY"
# vLLM's --tool-call-parser names of the formats brigade.entrypoints.openai.tool_calls.parse_tool_calls reads; it
# always runs under tool_choice "auto" (no --enable-auto-tool-choice needed): <tool_call>{json}</tool_call> blocks.
TOOL_CALL_PARSERS = ("hermes",)
STAT_LOG_INTERVAL_ENV = "BRIGADE_LOG_STATS_INTERVAL"  # vLLM's VLLM_LOG_STATS_INTERVAL; default 10 s (ServerSettings)
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def add_parser(subparsers, plugin_choices: Mapping[str, Sequence[str]] | None = None) -> argparse.ArgumentParser:
    """Add the ``serve`` sub-command to ``subparsers`` (from ``ArgumentParser.add_subparsers()``).

    Args:
        plugin_choices: installed plugin names per kind (``brigade.plugins.plugin_choices()``).
    """
    parser = subparsers.add_parser(
        "serve", help="serve a model over the OpenAI-compatible HTTP API", allow_abbrev=False,
        description="Serve MODEL (an HF-format directory) over the OpenAI-compatible HTTP API.")
    add_server_args(parser)
    add_engine_args(parser, plugin_choices)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Every check that needs no engine: the flags, then the platform's and the model's limits on them
    (``prepare_config`` on a copy: ``--kv-cache-memory`` against the RAM on the CPU, ``--max-model-len``
    against config.json, a ``--num-gpu-blocks-override`` pool too small for one request, the architecture, the
    quantization method and the layers it must hold
    (``check_quantized_layers``: a GPTQ checkpoint without brigade-gptq, ``--quantization gptq`` on an unquantized
    one, 3-bit...), the ``--lora-modules`` adapters). ``brigade``'s main runs it before the start-up log begins, and
    ``run`` before the port is bound, so a bad flag prints one line and a busy port never hides it.

    Raises:
        ConfigError: naming the bad flag and what would be right.
    """
    import copy

    from brigade.engine.core import check_kv_capacity, prepare_config
    from brigade.model_executor.loader import check_quantized_layers, get_model_class

    config = runnable_config_from_args(args)
    settings_from_args(args)
    resolved = copy.deepcopy(config)
    hf_config = prepare_config(resolved)
    get_model_class(hf_config)
    blocks = resolved.cache_config.num_gpu_blocks_override
    if blocks is not None:  # the pool's size is known before any weight loads
        check_kv_capacity(blocks, resolved.cache_config.block_size, resolved.model_config.max_model_len)
    check_quantized_layers(config.model_config, hf_config,
                           tensor_parallel_size=config.parallel_config.tensor_parallel_size)
    if config.lora_config is not None:  # each adapter read and checked against the model, one line if bad
        from brigade.lora.adapter import check_adapters

        check_adapters(config.lora_config, hf_config)
    args.serve_checked = True


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The HTTP flags of ``brigade serve``."""
    h = parser.add_argument_group("server")
    h.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    h.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    h.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on /v1/* and POST /pooling (also read from "
                        f"${API_KEY_ENV})")
    h.add_argument("--uvicorn-log-level", default="info", help=f"one of {', '.join(UVICORN_LOG_LEVELS)}")
    h.add_argument("--enable-log-requests", action="store_true",
                   help="log each request's id, prompt length and sampling parameters at INFO (off by default, "
                        "as in vLLM)")
    h.add_argument("--disable-log-requests", action="store_true",
                   help="deprecated: requests are not logged by default any more (this is the default); use "
                        "--enable-log-requests to log them")
    h.add_argument("--disable-log-stats", action="store_true",
                   help="do not log the periodic stats line (throughput, running and waiting requests, KV cache "
                        f"usage, prefix cache hit rate; every ${STAT_LOG_INTERVAL_ENV} seconds, default 10) nor call "
                        "stat logger plugins' log(); /metrics is unaffected")
    h.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='accepted for vLLM compatibility: Brigade always lets the model choose under tool_choice '
                        '"auto" (the default when a request has tools) and parses its calls, with or without it')
    h.add_argument("--tool-call-parser", metavar="NAME",
                   help=f"format of the tool calls parsed under tool_choice 'auto': {', '.join(TOOL_CALL_PARSERS)} "
                        "(<tool_call>{...}</tool_call> blocks of JSON with name and arguments, or a bare JSON call), "
                        "the only one implemented and always on; other vLLM parser names are refused")
    h.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long in-flight requests may finish after SIGTERM (default 5)")
    for flag, what in (("--allowed-origins", "origins"), ("--allowed-methods", "methods"),
                       ("--allowed-headers", "headers")):
        h.add_argument(flag, type=_json_string_list(flag), default=["*"], metavar="JSON",
                       help=f'CORS: the {what} browsers may use, a JSON list of strings (default ["*"])')
    h.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (cookies, auth)")
    h.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   help="serve GET /tokenizer_info (vLLM's): the tokenizer's class, its config and the chat template, "
                        "which lm-eval's remote tokenizer reads; off by default, as it may expose the chat template")
    h.add_argument("--disable-fastapi-docs", action="store_true",
                   help="do not serve /docs, /redoc and /openapi.json (FastAPI's pages load their scripts from "
                        "cdn.jsdelivr.net, so they are blank without internet access; /openapi.json is local)")


def _json_string_list(flag: str):
    """An argparse type: a JSON list of strings, as vLLM's CORS flags take (e.g. '["https://a.example"]')."""
    def parse(text: str) -> list[str]:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise argparse.ArgumentTypeError(f'{flag} takes a JSON list of strings such as \'["*"]\', got {text!r}')
        return value
    return parse


def settings_from_args(args: argparse.Namespace):
    """The ServerSettings of parsed ``serve`` flags. Raises ConfigError naming a bad flag."""
    from brigade.entrypoints.openai.api_server import ServerSettings

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.uvicorn_log_level not in UVICORN_LOG_LEVELS:
        raise ConfigError(f"--uvicorn-log-level {args.uvicorn_log_level!r} is not known; use one of "
                          f"{', '.join(UVICORN_LOG_LEVELS)}")
    if args.shutdown_timeout < 0:
        raise ConfigError(f"--shutdown-timeout must be non-negative seconds, got {args.shutdown_timeout}")
    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError("--api-key is empty, which would serve without any key; give a key, or leave the flag "
                          "out to serve without one on purpose")
    if args.enable_log_requests and args.disable_log_requests:
        raise ConfigError("--enable-log-requests and --disable-log-requests contradict each other; requests are not "
                          "logged by default, so give --enable-log-requests alone to log them")
    parser = args.tool_call_parser
    if parser is not None and parser not in TOOL_CALL_PARSERS:
        raise ConfigError(f"--tool-call-parser {parser!r} is not implemented; Brigade parses tool calls in one format, "
                          f"always on: use --tool-call-parser {' or '.join(TOOL_CALL_PARSERS)} (<tool_call> blocks "
                          "of JSON), or leave the flag out")
    interval = envs.VARIABLES[STAT_LOG_INTERVAL_ENV].raw()  # validated here for a one-line ConfigError
    stats: dict[str, float] = {}
    if interval is not None:
        try:
            stats["log_stats_interval_s"] = float(interval)
        except ValueError:
            stats["log_stats_interval_s"] = math.nan
        if not 0 < stats["log_stats_interval_s"] < math.inf:
            raise ConfigError(f"{STAT_LOG_INTERVAL_ENV}={interval!r} is not a positive number of seconds; unset it "
                              "for the default, 10")
    api_key = args.api_key if args.api_key is not None else envs.BRIGADE_API_KEY or None
    return ServerSettings(host=args.host, port=args.port, api_key=api_key, uvicorn_log_level=args.uvicorn_log_level,
                          log_requests=args.enable_log_requests, log_stats=not args.disable_log_stats,
                          shutdown_timeout_s=args.shutdown_timeout,
                          allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
                          allowed_headers=args.allowed_headers, allow_credentials=args.allow_credentials,
                          fastapi_docs=not args.disable_fastapi_docs,
                          tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint, **stats)


def run(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM. Returns 0; exits 2 on a bad flag, 1 if the port is taken or
    the engine fails to start.

    Plugins are loaded (scope "api") before anything else, so plugin flags resolve and plugin stat
    loggers and endpoints are available.
    """
    from brigade.plugins import load_plugins

    load_plugins("api")
    try:
        if not getattr(args, "serve_checked", False):  # brigade's main has run it already
            check(args)
        config = runnable_config_from_args(args)
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"brigade serve: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from brigade.entrypoints.openai.api_server import bind_socket, serve_http

    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        hint = ("pick another --port or stop the process using it" if exc.errno == errno.EADDRINUSE else
                "check --host (an address of this machine, 0.0.0.0 for all, or a name that resolves) and --port")
        print(f"brigade serve: error: cannot listen on {settings.host}:{settings.port} "
              f"({exc.strerror or exc}); {hint}", file=sys.stderr)
        raise SystemExit(1) from None
    from brigade.engine.core_client import EngineDeadError, EngineStartupError

    try:
        asyncio.run(serve_http(config, settings, sock))
    except ConfigError as exc:  # raised while the engine resolves the config against the model
        print(f"brigade serve: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (EngineStartupError, EngineDeadError) as exc:
        print(f"brigade serve: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        sock.close()
    return 0
