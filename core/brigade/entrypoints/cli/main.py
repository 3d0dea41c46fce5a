"""The ``brigade`` command. Plugins load before the parser is built, so flag choices list what is installed."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from brigade.version import __version__

_COMMANDS = ("serve", "generate", "bench", "plugins", "chat")


def build_parser(plugin_choices: dict[str, list[str]]) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand."""
    from brigade.entrypoints.cli import bench, chat, generate, plugins, serve

    parser = argparse.ArgumentParser(prog="brigade", description="Brigade: an LLM inference and serving engine.")
    parser.add_argument("--version", action="version", version=f"brigade {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(_COMMANDS) + "}")
    serve.add_parser(subparsers, plugin_choices)
    generate.add_parser(subparsers, plugin_choices)
    chat.add_parser(subparsers)
    bench.add_parser(subparsers, plugin_choices)
    plugins.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``brigade`` console script; returns the exit status."""
    logging.basicConfig(level=os.environ.get("BRIGADE_LOGGING_LEVEL", "INFO"),
                        format="%(levelname)s %(asctime)s %(message)s")
    from brigade.config import ConfigError
    from brigade.plugins import PluginLoadError, load_plugins, plugin_choices

    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    if (words[:1] != ["serve"] and "BRIGADE_LOGGING_LEVEL" not in os.environ
            and logging.getLogger("brigade.plugins").level == logging.NOTSET):
        # Which plugins loaded is the server's start-up log; other commands (and --help) keep only warnings.
        logging.getLogger("brigade.plugins").setLevel(logging.WARNING)
    try:
        load_plugins("api")
    except PluginLoadError as exc:
        print(f"brigade: {exc}", file=sys.stderr)
        return 1
    parser = build_parser(plugin_choices())
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"brigade {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
