"""The ``brigade`` command. Plugins load before the parser is built, so flag choices list what is installed."""

from __future__ import annotations

import argparse
import difflib
import logging
import sys

from brigade import envs
from brigade.version import __version__

_COMMANDS = ("serve", "generate", "bench", "plugins", "chat")
_ENGINE_COMMANDS = ("serve", "generate", "bench")  # may start an engine: BRIGADE_PLATFORM must name a platform


def is_client_command(argv: list[str]) -> bool:
    """Whether ``argv`` runs an HTTP client only (``chat``, ``bench serve`` without ``--launch``), which loads no
    plugin and resolves no platform: its engine flags, if any, are not checked against installed plugins."""
    words = [arg for arg in argv if not arg.startswith("-")][:2]
    return words[:1] == ["chat"] or (words == ["bench", "serve"] and "--launch" not in argv)


def build_parser(plugin_choices: dict[str, list[str]]) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand."""
    from brigade.entrypoints.cli import bench, chat, generate, plugins, serve

    # allow_abbrev=False on every parser: a prefix of a flag (--enable-prefix-cachin) is an error naming the flag
    # (``unrecognized``), not that flag, so a typo or a removed flag never quietly means another one.
    parser = argparse.ArgumentParser(prog="brigade", description="Brigade: an LLM inference and serving engine.",
                                     allow_abbrev=False)
    parser.add_argument("-V", "--version", action="version", version=f"brigade {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(_COMMANDS) + "}")
    serve.add_parser(subparsers, plugin_choices)
    generate.add_parser(subparsers, plugin_choices)
    chat.add_parser(subparsers)
    bench.add_parser(subparsers, plugin_choices)
    plugins.add_parser(subparsers)
    _one_line_errors(parser)
    return parser


def one_line_error(parser: argparse.ArgumentParser):
    """argparse's error(), minus the usage block: one line naming the flag (and where help is), then exit 2."""

    def error(message: str):
        print(f"{parser.prog}: error: {message} (see {parser.prog} --help)", file=sys.stderr)
        raise SystemExit(2)

    return error


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand parser under it ``one_line_error``."""
    parser.error = one_line_error(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _one_line_errors(sub)


class _HeldRecords(logging.Handler):
    """Holds the plugin loader's log records until the command line has parsed (``main``)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _deepest_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``args`` selected, e.g. ``brigade bench latency``'s."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, actions[0].dest, None) if actions else None
        if chosen is None or chosen not in actions[0].choices:
            return parser
        parser = actions[0].choices[chosen]


def _did_you_mean(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """`` (did you mean --flag?)`` for an unrecognized ``--`` flag that is a prefix of real flags (the shortest
    ones first, as argparse's abbreviations would have taken one) or close to one; with several such flags,
    ``(did you mean --a for --x, --b for --y?)``; else ""."""
    flags = sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")}, key=len)
    found: list[tuple[str, list[str]]] = []
    for arg in extra:
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or len(name) < 3:
            continue
        matches = [f for f in flags if f.startswith(name)][:3] or difflib.get_close_matches(name, flags, n=1)
        if matches:
            found.append((name, matches))
    if len(found) == 1:
        return f" (did you mean {' or '.join(found[0][1])}?)"
    if found:
        return f" (did you mean {', '.join(' or '.join(m) + ' for ' + name for name, m in found)}?)"
    return ""


def normalize_flag_spelling(argv: list[str]) -> list[str]:
    """``--max_model_len`` means ``--max-model-len``, as in vLLM's command line: underscores in an option's
    name (before any ``=``) become dashes. Values and everything after a bare ``--`` are left as they are."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + argv[i:]
        if arg.startswith("--") and "_" in arg.split("=", 1)[0]:
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        out.append(arg)
    return out


def main(argv: list[str] | None = None, *, handle_signals: bool | None = None) -> int:
    """Entry point of the ``brigade`` console script; returns the exit status.

    With ``handle_signals`` (default: ``argv`` is None, as for the console script), SIGINT and SIGTERM end it at
    once with one line and status 130 or 143 (``interrupts.py``) until ``serve``'s server takes them over.

    The plugin loader's log lines are held until the command line parses and, for a command that sets a
    ``check`` default (``serve``), until its flags pass that check: a bad flag or ``--help`` prints only its
    one error line. Then ``serve`` replays them all (which plugins loaded is the server's start-up log);
    other commands replay warnings only.
    """
    from brigade.entrypoints.cli import interrupts

    handle_signals = argv is None if handle_signals is None else handle_signals
    if handle_signals:
        interrupts.exit_on_interrupt("brigade")
    logging.basicConfig(level=envs.BRIGADE_LOGGING_LEVEL,
                        format="%(levelname)s %(asctime)s %(message)s")
    from brigade.config import ConfigError
    from brigade.plugins import PluginLoadError, load_plugins, plugin_choices, process_plugin_manager

    argv = normalize_flag_spelling(sys.argv[1:] if argv is None else list(argv))
    plugin_log = logging.getLogger("brigade.plugins")
    held, propagate = _HeldRecords(), plugin_log.propagate
    plugin_log.addHandler(held)
    plugin_log.propagate = False
    try:
        client = is_client_command(argv)
        try:
            if not client:
                load_plugins("api")
        except PluginLoadError as exc:
            print(f"brigade: {exc}", file=sys.stderr)
            return 1
        parser = build_parser({} if client else plugin_choices())
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the subcommand that received them, with its own usage line
            deepest = _deepest_parser(parser, args)
            deepest.error(f"unrecognized arguments: {' '.join(extra)}{_did_you_mean(deepest, extra)}")
        check = getattr(args, "check", None)
        try:
            if check is not None:
                check(args)
            if args.command in _ENGINE_COMMANDS and not client:
                process_plugin_manager().check_forced_platform()
        except (ConfigError, PluginLoadError) as exc:
            print(f"brigade {args.command}: error: {exc}", file=sys.stderr)
            return 2
    finally:
        plugin_log.removeHandler(held)
        plugin_log.propagate = propagate
    _replay(held.records, args.command)
    if handle_signals and args.command in _ENGINE_COMMANDS:
        interrupts.exit_on_interrupt(f"brigade {args.command}")
    elif handle_signals:
        interrupts.restore_default_signals()
    if args.command is None:  # as ``vllm`` with no command: the help, and success
        parser.print_help()
        return 0
    return _run_command(args)


def _replay(records: list[logging.LogRecord], command: str | None) -> None:
    """Log the plugin loader's held records: all of them for ``serve`` or an explicit log level, else only the
    warnings that concern any command (not the server-only notices)."""
    from brigade.plugins.manager import SERVER_ONLY_NOTICE

    plugin_log = logging.getLogger("brigade.plugins")
    explicit = envs.VARIABLES["BRIGADE_LOGGING_LEVEL"].is_set() or plugin_log.level != logging.NOTSET
    for record in records:
        if command == "serve" or explicit or (record.levelno >= logging.WARNING
                                              and not getattr(record, SERVER_ONLY_NOTICE, False)):
            plugin_log.handle(record)


def _run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; its known failures are one stderr line and an exit status: a config error 2, a
    plugin that failed once the command ran or an in-process engine (generate, bench) that could not start 1."""
    from brigade.config import ConfigError
    from brigade.entrypoints.cli.start_engine import is_engine_startup_error
    from brigade.plugins import PluginLoadError

    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"brigade {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except PluginLoadError as exc:  # a plugin failed once the command ran (platform detection, a factory)
        print(f"brigade {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not is_engine_startup_error(exc):  # as serve gives for its engine process
            raise
        print(f"brigade {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
