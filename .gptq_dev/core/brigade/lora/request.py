"""LoRARequest: which adapter a request runs with (vLLM's ``LoRARequest(lora_name, lora_int_id, lora_path)``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """An adapter by name. Requests carry only ``lora_name`` past the front end (the scheduler and the
    prefix-cache hashes key on it); the path is read once, when the adapter is registered.

    Attributes:
        lora_name: unique per engine; the server's ``model`` value for it.
        lora_int_id: a positive id, as in vLLM (kept for API compatibility; Brigade keys on the name).
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
