"""LoRAConfig: LoRA adapter limits and the adapters loaded at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from brigade.config.errors import ConfigError


POSSIBLE_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's; an adapter of a lower rank fits too


@dataclass
class LoRAConfig:
    """Multi-LoRA serving (--enable-lora, Hu et al. 2021 arXiv:2106.09685). Present on a
    BrigadeConfig only when LoRA is enabled."""

    max_loras: int = 1
    """Most distinct adapters in one batch (one weight slot each on the device); vLLM's default 1."""
    max_cpu_loras: int | None = None
    """Most adapters whose weights are kept in host memory (an LRU cache; one evicted is read again from its
    folder when a request needs it); None: ``max_loras``, as in vLLM. It does not cap the adapters served."""
    max_lora_rank: int = 16
    """Largest adapter rank accepted; the slots are sized for it (vLLM's default 16)."""
    lora_modules: dict[str, str] = field(default_factory=dict)
    """Adapters loaded at start-up: name (what clients send as ``model``) -> PEFT adapter folder."""

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ConfigError(f"--max-loras must be at least 1, got {self.max_loras}")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"--max-cpu-loras must be at least --max-loras ({self.max_loras}), got "
                              f"{self.max_cpu_loras}: the host cache holds every adapter of a batch; give "
                              f"--max-cpu-loras {self.max_loras} or more, or leave it out (it defaults to --max-loras)")
        if self.max_lora_rank not in POSSIBLE_MAX_LORA_RANKS:
            raise ConfigError(f"--max-lora-rank must be one of {', '.join(map(str, POSSIBLE_MAX_LORA_RANKS))} "
                              f"(as in vLLM), got {self.max_lora_rank}")
        for name, path in self.lora_modules.items():
            if not name or not name.strip():
                raise ConfigError(f"--lora-modules: an adapter name is empty (path {path!r}); give NAME=PATH")

    def check_names(self, served_model_names: str | list[str]) -> None:
        """Raises ConfigError when an adapter is named like the served model, or like one of its names
        (requests could not pick it)."""
        names = [served_model_names] if isinstance(served_model_names, str) else served_model_names
        for name in names:
            if name in self.lora_modules:
                raise ConfigError(f"--lora-modules: adapter name {name!r} is the served model's name; "
                                  "give the adapter another name")
