"""UniProcExecutor: one worker inside the EngineCore process."""

from __future__ import annotations

from brigade.config import BrigadeConfig
from brigade.executor.abstract import Executor
from brigade.interfaces import AsyncModelRunnerOutput, ModelRunnerOutput, SchedulerOutput
from brigade.utils import resolve_obj_by_qualname


class UniProcExecutor(Executor):
    """Runs the platform's worker class in this process on local rank 0."""

    def __init__(self, config: BrigadeConfig, hf_config):
        super().__init__(config, hf_config)
        worker_cls = resolve_obj_by_qualname(config.parallel_config.worker_cls)
        self.worker = worker_cls(config, local_rank=0, rank=0)
        self.worker.init_device(hf_config)
        self.worker.load_model()

    def determine_num_kv_blocks(self) -> int:
        return self.worker.determine_num_kv_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.worker.initialize_kv_cache(num_blocks)

    def kv_cache_layout(self):
        return self.worker.kv_cache_layout()

    def add_lora(self, lora_request) -> bool:
        return self.worker.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.worker.remove_lora(lora_int_id)

    def execute_model(self, scheduler_output: SchedulerOutput, *,
                      overlap: bool = False) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.worker.execute_model(scheduler_output, overlap=overlap)

    def shutdown(self) -> None:
        self.worker.shutdown()
