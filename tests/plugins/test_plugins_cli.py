"""`brigade plugins` wiring: add_parser/run as the main CLI calls them, JSON and table output."""

from __future__ import annotations

import argparse
import io
import json

from brigade.entrypoints.cli import plugins as plugins_cli
from brigade.plugins import plugin_choices


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
