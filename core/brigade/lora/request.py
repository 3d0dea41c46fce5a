"""LoRARequest: which adapter a request runs with (vLLM's ``LoRARequest(lora_name, lora_int_id, lora_path)``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """An adapter by name and id. Requests carry only ``lora_name`` and ``lora_int_id`` past the front end;
    the path is read once, when the adapter is registered.

    Attributes:
        lora_name: unique among the adapters an engine serves at one time; the server's ``model`` value for it.
        lora_int_id: a positive id, as in vLLM. The engine core keys on it (slots, the ``--max-loras`` count,
            prefix-cache hashes), so one id is one set of weights for the engine's whole life: a front end
            never gives an unloaded adapter's id to another one (a server loading an adapter at runtime takes
            a fresh id, and an adapter unloaded then loaded again under the same name gets a new one).
        lora_path: a PEFT adapter folder (adapter_config.json, adapter_model.safetensors).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest: lora_name must be a non-empty string, got {self.lora_name!r}")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_int_id must be a positive int, "
                             f"got {self.lora_int_id!r}")


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
