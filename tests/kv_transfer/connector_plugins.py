"""What the KV-connector plugin tests share: that a connector comes from its installed distribution's entry point,
and ``brigade serve``'s parser built with the installed plugins' choices."""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path

from brigade.config import KVTransferConfig
from brigade.entrypoints.cli import serve
from brigade.kv_transfer import get_connector_class
from brigade.plugins import load_plugins, plugin_choices, registries


def assert_connector_comes_from(plugin: str, distribution: str, connector: str) -> None:
    """``connector`` is registered by the ``brigade.general_plugins`` entry point ``plugin`` of the installed
    ``distribution`` (whose plugin module is ``<package>.plugin``), is a ``--kv-transfer-config`` choice, and
    resolves to the class in ``<package>.connector``."""
    package = distribution.replace("-", "_")
    points = [p for p in importlib.metadata.entry_points(group="brigade.general_plugins")
              if p.value == f"{package}.plugin"]
    assert len(points) == 1, f"{distribution} is not installed: run ./scripts/setup.sh"
    assert points[0].name == plugin and points[0].dist.name == distribution
    load_plugins("engine")
    entry = registries.kv_connectors.entry(connector)
    assert (entry.source.plugin, entry.source.distribution) == (plugin, distribution)
    assert connector in plugin_choices()["kv_connector"]
    assert get_connector_class(KVTransferConfig(connector)).__module__ == f"{package}.connector"


def parse_serve(model: Path, kv_json: str) -> argparse.Namespace:
    """``brigade serve MODEL --kv-transfer-config KV_JSON`` parsed by serve's parser with the installed plugins'
    choices (nothing runs)."""
    load_plugins("engine")
    parser = argparse.ArgumentParser(prog="brigade")
    serve.add_parser(parser.add_subparsers(dest="command"), plugin_choices())
    return parser.parse_args(["serve", str(model), "--kv-transfer-config", kv_json])
