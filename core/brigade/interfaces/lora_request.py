"""LoRARequest: which adapter a request runs with (vLLM's ``LoRARequest(lora_name, lora_int_id, lora_path)``).

A value type that crosses the process boundary (``EngineCoreUtility.lora_request``); ``brigade.lora`` exports it
to users under its usual name.
"""

from __future__ import annotations

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
