"""`brigade plugins` wiring: add_parser/run as the main CLI calls them, JSON and table output."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys

from brigade.entrypoints.cli import plugins as plugins_cli
from brigade.plugins import load_plugins, plugin_choices, registries
from brigade.plugins.kernels import kernel_table


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="brigade")
    subparsers = parser.add_subparsers(dest="command")
    plugins_cli.add_parser(subparsers)
    return parser.parse_args(argv)


def test_json_listing_has_the_builtin_plugin_platform_and_choices():
    args = parse(["plugins", "--json"])
    out = io.StringIO()
    assert args.run(args, out) == 0
    data = json.loads(out.getvalue())
    builtin = [p for p in data["plugins"] if p["name"] == "builtin"]
    assert builtin and builtin[0]["status"] == "loaded" and builtin[0]["distribution"] == "brigade"
    assert data["hookspec_version"] == "1.0"
    assert {"name", "distribution", "reason", "class"} <= set(data["platform"])
    assert "reference" in data["choices"]["attention_backend"]
    assert set(data["registries"]) >= {"attention_backends", "models", "endpoints"}


def test_table_lists_columns_and_the_active_platform_line():
    args = parse(["plugins"])
    assert args.json is False
    out = io.StringIO()
    assert args.run(args, out) == 0
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "STATUS"]
    assert all(len(line) <= 100 for line in lines), [line for line in lines if len(line) > 100]
    # A plugin's row, then its indented group, scope and hooks, up to the next plugin's row.
    start = next(i for i, line in enumerate(lines) if line.startswith("builtin "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    assert lines[start].split()[:4] == ["builtin", "brigade", "0.1.0", "loaded"]
    block = " ".join(lines[start:end])
    assert "group: general_plugins" in block and "attention_backends" in block
    assert "\nactive platform: " in text and "hook specs: 1.0" in text


def test_plugin_choices_keys_match_the_engine_flags():
    assert set(plugin_choices()) == {"quantization", "attention_backend", "kv_connector", "io_processor"}


def test_the_command_fits_a_100_column_terminal_stderr_included():
    """As a user types it: no log line beside the table (the platform choice is the table's own line)."""
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "brigade.entrypoints.cli.main", "plugins"], capture_output=True,
                          text=True, timeout=120, env={**env, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]
    assert "active platform: " in proc.stdout
    assert all(len(line) <= 100 for line in proc.stdout.splitlines()), proc.stdout


def test_the_cuda_kernels_section_names_each_op_within_100_columns():
    load_plugins("api")
    kernels = kernel_table(registries.kernels, "cuda")  # brigade-cuda registers them on any host
    lines = plugins_cli.render_kernels(kernels, "cuda", width=100)
    assert lines[1].split() == ["OP", "KERNEL", "PLUGIN"] and all(len(line) <= 100 for line in lines), lines
    assert {line.split()[0] for line in lines[2:]} == {k["op"] for k in kernels} >= {"dense_gemm", "rms_norm"}
