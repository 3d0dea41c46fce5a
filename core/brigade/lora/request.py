"""Helpers over LoRARequests (``brigade.interfaces.LoRARequest``): the ``--lora-modules`` numbering and adapter
names in messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from brigade.interfaces import LoRARequest


def lora_module_requests(lora_modules: Mapping[str, str]) -> dict[str, LoRARequest]:
    """The ``--lora-modules`` adapters (name -> path) as LoRARequests by name, with ids 1, 2, ... in the given
    order: the numbering every layer that registers them at start-up uses (front end, engine core, runner)."""
    return {name: LoRARequest(name, i, path) for i, (name, path) in enumerate(lora_modules.items(), start=1)}


MAX_LISTED_NAMES = 20


def name_list(names: Iterable[str], limit: int = MAX_LISTED_NAMES) -> str:
    """Adapter names for a message: quoted, comma-separated, at most ``limit`` of them ("and N more" after),
    each cut to 64 characters, so that an error body stays small however many adapters are loaded."""
    names = list(names)
    shown = [repr(n if len(n) <= 64 else n[:64] + "...") for n in names[:limit]]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown) + more
