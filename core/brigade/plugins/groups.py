"""Entry-point groups, the processes that load each, and discovery through importlib.metadata.

Group and process boundary together decide the load scope:

==============================  ===========================================  ==================
group                           loaded in                                    default
==============================  ===========================================  ==================
brigade.general_plugins         every process (API, EngineCore, workers)     all
brigade.platform_plugins        every process; detection on first use        all
brigade.io_processor_plugins    the API process only                         all
brigade.stat_logger_plugins     the API process only                         all
brigade.endpoint_plugins        the API server only                          none (deny)
==============================  ===========================================  ==================
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PluginGroup:
    """One entry-point group and where it loads."""

    name: str  # entry-point group, e.g. "brigade.general_plugins"
    scope: str  # which processes load it, for listings
    endpoint: bool = False  # deny by default and governed by BRIGADE_ENDPOINT_PLUGINS


GENERAL = PluginGroup("brigade.general_plugins", "every process")
PLATFORM = PluginGroup("brigade.platform_plugins", "every process (platform detected on first use)")
IO_PROCESSOR = PluginGroup("brigade.io_processor_plugins", "API process")
STAT_LOGGER = PluginGroup("brigade.stat_logger_plugins", "API process")
ENDPOINT = PluginGroup("brigade.endpoint_plugins", "API server (deny by default)", endpoint=True)

ALL_GROUPS: tuple[PluginGroup, ...] = (GENERAL, PLATFORM, IO_PROCESSOR, STAT_LOGGER, ENDPOINT)

SCOPES: dict[str, tuple[PluginGroup, ...]] = {
    # EngineCore and worker processes (and anything that only runs models).
    "engine": (GENERAL, PLATFORM),
    # The API server process (and `brigade plugins`, which shows everything).
    "api": ALL_GROUPS,
}
"""load_plugins(scope) -> the groups that scope loads."""

CORE_DISTRIBUTION = "brigade"
BUILTIN_PLUGIN = "builtin"
"""The core's own plugin: registered first in every process, whatever the allowlist says."""


def normalize_distribution(name: str) -> str:
    """PEP 503 normalization, so "Brigade_CUDA" and "brigade-cuda" compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def discover(group: PluginGroup) -> list[importlib.metadata.EntryPoint]:
    """Installed entry points of ``group``, sorted by (name, distribution) so load order is stable.

    The core's own ``builtin`` entry point is left out: the manager registers the builtin plugin
    directly, so it loads even when the core runs from a source tree without package metadata.
    """
    found = []
    for ep in importlib.metadata.entry_points(group=group.name):
        dist = ep.dist.name if ep.dist is not None else ""
        if ep.name == BUILTIN_PLUGIN and normalize_distribution(dist) == CORE_DISTRIBUTION:
            continue
        found.append(ep)
    return sorted(found, key=lambda ep: (ep.name, ep.dist.name if ep.dist is not None else ""))


def distribution_of(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    """(distribution name, version) of an entry point; ("unknown", "") when metadata lacks it."""
    if ep.dist is None:
        return "unknown", ""
    return ep.dist.name, ep.dist.version
