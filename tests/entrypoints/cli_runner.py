"""Running the ``brigade`` command as a user does, and checking its one-line errors.

Shared by the command-line tests here and the LoRA and quantization tests that check their flags.

``run_cli`` starts the console script (about a second of interpreter start and imports per call); ``run_main``
runs the same entry point, ``main(argv)``, in this process. Errors found before anything loads go through
``run_main`` case by case; each such code path keeps one ``run_cli`` test for what only a fresh process shows (the
plugin loader's held start-up lines, interpreter warnings, the console script itself).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import subprocess

from remote_server import brigade_command


def run_cli(*argv: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    """``brigade ARGV`` at the default log level (no BRIGADE_LOGGING_LEVEL), as a user runs it; ``stdin`` is its
    whole input (none: an empty one), ``env`` adds to this process's environment."""
    base = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    return subprocess.run([*brigade_command(), *argv], capture_output=True, text=True, timeout=timeout,
                          input=stdin if stdin is not None else "", env={**base, **(env or {})})


def run_main(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``brigade ARGV`` through its entry point (``brigade.entrypoints.cli.main.main``) in this process, at the
    default log level (no BRIGADE_LOGGING_LEVEL; ``env`` adds variables for the call): its exit status (the return
    value, or a SystemExit's code) and what it printed to stdout and stderr, log lines included (``main``'s
    logging set-up writes them to the captured stderr, as the command's does). For commands that stop before
    anything loads: one that went on would run here."""
    from brigade.entrypoints.cli.main import main

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out, err = io.StringIO(), io.StringIO()
    saved = {name: os.environ.get(name) for name in ["BRIGADE_LOGGING_LEVEL", *(env or {})]}
    os.environ.pop("BRIGADE_LOGGING_LEVEL", None)
    os.environ.update(env or {})
    root.handlers = []  # so main's logging.basicConfig writes to the captured stderr, as in a fresh process
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(argv))
            except SystemExit as exc:  # argparse's errors, --help, --version
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return subprocess.CompletedProcess(["brigade", *argv], status, out.getvalue(), err.getvalue())


def assert_one_line(proc: subprocess.CompletedProcess, prefix: str, needle: str, *, status: int = 2) -> str:
    """The command exited with ``status`` and printed exactly one stderr line, ``PREFIX: error: ...`` containing
    ``needle`` (no traceback, no usage); returns that line."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == status, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(prefix + ": error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr
    return lines[0]


def serve_args(*argv: str) -> argparse.Namespace:
    """``brigade serve ARGV`` parsed in-process by serve's own parser (nothing runs)."""
    from brigade.entrypoints.cli import serve

    parser = argparse.ArgumentParser(prog="brigade")
    serve.add_parser(parser.add_subparsers(dest="command"), {})
    return parser.parse_args(["serve", *argv])


def parse(*argv: str) -> argparse.Namespace:
    """``brigade ARGV`` parsed in-process by the whole command's parser (nothing runs)."""
    from brigade.entrypoints.cli.main import build_parser

    return build_parser({}).parse_args(list(argv))
