"""The Executor interface: the EngineCore's only handle on the workers."""

from __future__ import annotations

from abc import ABC, abstractmethod

from brigade.config import BrigadeConfig
from brigade.interfaces import AsyncModelRunnerOutput, ModelRunnerOutput, SchedulerOutput
from brigade.interfaces.kv_cache_spec import KVCacheConfig, KVCacheGroup, KVCacheSpec
from brigade.kv_transfer import check_kv_transfer_config


class Executor(ABC):
    """Starts the workers, sizes the KV cache across them, and runs one step on all of them."""

    def __init__(self, config: BrigadeConfig, hf_config):
        self.config = config
        self.hf_config = hf_config

    @staticmethod
    def get_class(config: BrigadeConfig) -> type[Executor]:
        """uni for one device (or when asked), mp for several, ray when asked.

        Raises:
            ConfigError: settings this build cannot run (``BrigadeConfig.check_supported``), a KV connector
                it cannot run (``check_kv_transfer_config``), or ray without Ray or its cluster
                (``ray_cluster.check_ray_backend``).
        """
        config.check_supported()
        check_kv_transfer_config(config.kv_transfer_config)
        backend = config.parallel_config.distributed_executor_backend
        if backend is None:
            backend = "uni" if config.parallel_config.world_size == 1 else "mp"
        if backend == "uni":
            if config.parallel_config.world_size != 1:
                raise ValueError("--distributed-executor-backend uni runs one device; "
                                 "use mp for tensor or pipeline parallelism")
            from brigade.executor.uniproc import UniProcExecutor

            return UniProcExecutor
        if backend == "mp":
            from brigade.executor.multiproc import MultiprocExecutor

            return MultiprocExecutor
        if backend == "ray":
            from brigade.executor.ray_cluster import check_ray_backend

            check_ray_backend()
            from brigade.executor.ray_executor import RayExecutor

            return RayExecutor
        raise ValueError(f"--distributed-executor-backend {backend} is not available in this build; use uni, mp or "
                         "ray")

    @abstractmethod
    def kv_cache_specs(self) -> dict[int, KVCacheSpec]:
        """The KV cache spec of every attention layer of the model: the union of every worker's layers (pipeline
        stages hold different layers; tensor-parallel ranks agree)."""

    @abstractmethod
    def determine_num_kv_blocks(self, groups: tuple[KVCacheGroup, ...]) -> int:
        """The number of KV blocks every worker can hold under the KV cache ``groups`` (the minimum over
        workers)."""

    @abstractmethod
    def initialize_kv_cache(self, config: KVCacheConfig) -> None:
        """Allocate the KV cache of ``config`` on every worker."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput, *,
                      overlap: bool = False) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Run one step; the output comes from the driver worker.

        Returns a ModelRunnerOutput, or with ``overlap`` an AsyncModelRunnerOutput whose ``get()`` returns it
        once the device is done (the call itself returns as soon as the work is queued).
        """

    def execute_dummy_batch(self) -> None:
        """Run one forward pass of a dummy token on every worker, with no KV write that matters and no output:
        what a data-parallel engine with nothing scheduled runs while the others step, so that their MoE layers'
        collectives over every engine do not wait for it (vLLM's ``execute_dummy_batch``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run dummy batches")

    def kv_cache_layout(self):
        """The workers' ``brigade.kv_transfer.KVCacheLayout`` (the driver's), for the scheduler-role KV connector."""
        raise NotImplementedError(f"{type(self).__name__} cannot describe its KV cache layout")

    def add_lora(self, lora_request) -> bool:
        """Register a LoRA adapter (``brigade.lora.LoRARequest``) on every worker; False when its id is taken.

        Raises:
            LoRAError: the adapter cannot be served (or LoRA is off).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot add LoRA adapters")

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop a LoRA adapter from every worker; False when none has that id. The engine core calls it only
        once no unfinished request runs on the adapter (a step already launched may still use it: the workers
        order the removal after it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot remove LoRA adapters")

    def shutdown(self) -> None:
        """Stop the workers."""
