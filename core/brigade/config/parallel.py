"""ParallelConfig: worker counts and the executor backend."""

from __future__ import annotations

from dataclasses import dataclass

from brigade.config.errors import ConfigError


@dataclass
class ParallelConfig:
    """How the model is spread over devices."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    """uni, mp or ray; None picks uni for one device and mp for more."""
    worker_cls: str = "auto"
    """Dotted path of the Worker class; the platform sets it in check_and_update_config."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.distributed_executor_backend not in (None, "uni", "mp", "ray"):
            raise ConfigError(f"--distributed-executor-backend {self.distributed_executor_backend!r} "
                              "is not known; use uni, mp or ray")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size
