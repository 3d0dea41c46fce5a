"""UniProcExecutor: one worker inside the EngineCore process (one rank of the world of every engine's workers when
data-parallel engines step in lockstep: ``worker_proc.join_world``)."""

from __future__ import annotations

import logging

from brigade.config import BrigadeConfig
from brigade.executor.abstract import Executor
from brigade.executor.worker_proc import expert_param_bytes, join_world, make_device_communicators
from brigade.interfaces import AsyncModelRunnerOutput, ModelRunnerOutput, SchedulerOutput
from brigade.utils import resolve_obj_by_qualname

logger = logging.getLogger(__name__)


class UniProcExecutor(Executor):
    """Runs the platform's worker class in this process on local rank 0."""

    def __init__(self, config: BrigadeConfig, hf_config):
        super().__init__(config, hf_config)
        worker_cls = resolve_obj_by_qualname(config.parallel_config.worker_cls)
        self.worker = worker_cls(config, local_rank=0, rank=0)
        # Alone in its engine, but with lockstep data-parallel engines one rank of their world (engine_world).
        self.state = join_world(config, self.worker, 0, "")
        try:
            self.worker.init_device(hf_config)
            make_device_communicators(self.state, self.worker.device)
            self.worker.load_model()
            if self.state is not None:
                logger.info("%s, %.1f KiB of experts", self.state.describe(),
                            expert_param_bytes(self.worker.model_runner.model) / 1024)
        except BaseException:
            self._leave_world()
            raise

    def kv_cache_specs(self):
        return self.worker.kv_cache_specs()

    def determine_num_kv_blocks(self, groups) -> int:
        return self.worker.determine_num_kv_blocks(groups)

    def initialize_kv_cache(self, config) -> None:
        self.worker.initialize_kv_cache(config)

    def kv_cache_layout(self):
        return self.worker.kv_cache_layout()

    def add_lora(self, lora_request) -> bool:
        return self.worker.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.worker.remove_lora(lora_int_id)

    def execute_model(self, scheduler_output: SchedulerOutput, *,
                      overlap: bool = False) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.worker.execute_model(scheduler_output, overlap=overlap)

    def execute_dummy_batch(self) -> None:
        self.worker.execute_dummy_batch()

    def shutdown(self) -> None:
        try:
            self.worker.shutdown()
        finally:
            self._leave_world()

    def _leave_world(self) -> None:
        if self.state is not None:
            self.state.destroy()
            self.state = None
