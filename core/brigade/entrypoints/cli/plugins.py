"""`brigade plugins`: every installed plugin with its distribution, group, scope, hooks and status, the
active platform with the reason it was chosen, and which kernel serves which op on it (docs/plugins.md).

The CLI's ``main`` calls ``load_plugins("api")`` before building its parser, so plugin-backed flags can
list their choices (``plugin_choices``); this command then only reads the records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import Any, TextIO

from brigade import envs
from brigade.plugins import (HOOKSPEC_VERSION, PluginLoadError, load_plugins, platform_choice, plugin_choices,
                             plugin_records, registries)
from brigade.entrypoints.cli.text_table import GAP, WIDTH, TableLayout, wrap_text
from brigade.plugins.kernels import kernel_table
from brigade.plugins.settings import PluginSettings

__all__ = ["add_parser", "collect", "main", "plugin_choices", "render_kernels", "render_table", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``plugins`` subcommand to ``subparsers`` and return its parser (``run`` is its handler)."""
    parser = subparsers.add_parser(
        "plugins", help="list installed plugins, their status and the active platform", allow_abbrev=False,
        description="List every installed Brigade plugin (name, distribution and version, entry-point group, "
                    "load scope, hooks, status), the active platform with the reason it was chosen, and which kernel "
                    "serves which op on it.")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.set_defaults(run=run)
    return parser


def collect() -> dict[str, Any]:
    """Load every plugin group, resolve the platform, and gather the listing as JSON-ready data.

    A platform that cannot be resolved is reported under ``platform_error``, not raised, so the listing
    still shows which plugins are to blame. Fatal load errors (strict mode, named plugins) do raise.
    """
    load_plugins("api")
    platform: dict[str, Any] | None = None
    platform_error: str | None = None
    try:
        platform = platform_choice().to_json()
    except PluginLoadError as exc:
        platform_error = str(exc)
    settings = PluginSettings.from_env()
    return {
        "hookspec_version": HOOKSPEC_VERSION,
        "settings": {"BRIGADE_PLUGINS": _listed(settings.allowlist),
                     "BRIGADE_ENDPOINT_PLUGINS": _listed(settings.endpoint_allowlist),
                     "BRIGADE_PLATFORM": settings.platform, "BRIGADE_PLUGINS_STRICT": settings.strict},
        "plugins": [record.to_json() for record in plugin_records()],
        "platform": platform,
        "platform_error": platform_error,
        "kernels": [] if platform is None else kernel_table(registries.kernels, platform["name"]),
        "registries": registries.as_names(),
        "choices": plugin_choices(),
    }


def _listed(names: frozenset[str] | None) -> list[str] | None:
    return None if names is None else sorted(names)


def render_table(data: dict[str, Any], out: TextIO, width: int = WIDTH) -> None:
    """Print the listing within ``width`` columns: one row per plugin (name, distribution, status, the status
    wrapped under itself), its entry-point group, scope and hooks on the lines below, then the platform line."""
    rows = [("NAME", "DISTRIBUTION", "STATUS")]
    details = []
    for p in data["plugins"]:
        status = p["status"] + (f": {p['reason']}" if p["reason"] and p["status"] != "loaded" else "")
        if p["platforms"]:
            status += " [" + ", ".join(f"{k}: {v}" for k, v in p["platforms"].items()) + "]"
        rows.append((p["name"], f"{p['distribution']} {p['version']}".strip(), status))
        hooks = ", ".join(h.removeprefix("register_") for h in p["hooks"]) or "-"
        details.append(f"group: {p['group'].removeprefix('brigade.')}; scope: {p['scope']}; hooks: {hooks}")
    layout = TableLayout.fit(rows, width)
    indent = layout.widths[0] + len(GAP)  # details start under the distribution
    lines = layout.format(rows[0])
    for row, detail in zip(rows[1:], details):
        lines += layout.format(row) + wrap_text(detail, width=width, indent=indent)
    lines += ["", f"hook specs: {data['hookspec_version']}"]
    if data["platform"] is not None:
        p = data["platform"]
        platform = f"active platform: {p['name']} ({p['distribution']} {p['version']}): {p['reason']}"
    else:
        platform = f"active platform: none: {data['platform_error']}"
    lines += wrap_text(platform, width=width)
    if data["platform"] is not None:
        lines += [""] + render_kernels(data["kernels"], data["platform"]["name"], width)
    out.write("\n".join(lines) + "\n")


def render_kernels(kernels: list[dict[str, str]], platform: str, width: int = WIDTH) -> list[str]:
    """The ``kernels on PLATFORM`` section as lines within ``width`` columns: one ``OP  KERNEL  PLUGIN`` row per
    registered op; ops not listed run their PyTorch path."""
    if not kernels:
        return wrap_text(f"kernels on {platform}: none (every op runs its PyTorch path)", width=width)
    rows = [("OP", "KERNEL", "PLUGIN")] + [(k["op"], k["kernel"], f"{k['plugin']} ({k['distribution']})")
                                           for k in kernels]
    layout = TableLayout.fit(rows, width)
    lines = wrap_text(f"kernels on {platform} (other ops run their PyTorch path):", width=width)
    for row in rows:
        lines += layout.format(row)
    return lines


@contextlib.contextmanager
def _info_lines_held():
    """Drop the plugin loader's log records below WARNING while the listing is collected, unless
    ``BRIGADE_LOGGING_LEVEL`` is set: its INFO line on the platform choice is the listing's own "active platform"
    line, and a log line that long would not fit a 100-column terminal. Warnings still show."""
    if envs.VARIABLES["BRIGADE_LOGGING_LEVEL"].is_set():
        yield
        return
    plugin_log = logging.getLogger("brigade.plugins")
    warnings_only = lambda record: record.levelno >= logging.WARNING  # noqa: E731
    plugin_log.addFilter(warnings_only)
    try:
        yield
    finally:
        plugin_log.removeFilter(warnings_only)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print the listing; returns the exit status (1 when the platform cannot be resolved)."""
    out = out or sys.stdout
    with _info_lines_held():
        data = collect()
    if args.json:
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        render_table(data, out)
    return 0 if data["platform_error"] is None else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m brigade.entrypoints.cli.plugins [--json]``, the same command outside the main CLI."""
    parser = argparse.ArgumentParser(prog="brigade plugins", allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_parser(subparsers)
    try:
        args = parser.parse_args(["plugins", *(sys.argv[1:] if argv is None else argv)])
        return args.run(args)
    except PluginLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
