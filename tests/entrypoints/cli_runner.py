"""Running the ``brigade`` command as a user does, and checking its one-line errors.

Shared by the command-line tests here and the LoRA and quantization tests that check their flags.
"""

from __future__ import annotations

import argparse
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
