"""EngineCore: the busy loop's body. One ``step()`` is schedule, execute, update (book ch. 1, 4).

It lives in its own process behind ZMQ when serving (engine/core_proc.py), or in the caller's process
for the offline LLM class. Either way it sees only EngineCoreRequest messages and returns
EngineCoreOutputs.
"""

from __future__ import annotations

import logging

from brigade.config import BrigadeConfig
from brigade.core.request import Request, RequestStatus
from brigade.core.scheduler import Scheduler
from brigade.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, UtilityMethod
from brigade.executor.abstract import Executor

logger = logging.getLogger("brigade.engine")


def prepare_config(config: BrigadeConfig):
    """Load plugins, let the platform fill in its choices, and resolve model-dependent limits.

    Returns the model's HF config. Safe to call in every process that builds an engine.
    """
    from brigade.model_executor.loader import get_hf_config
    from brigade.plugins import current_platform, load_plugins

    load_plugins("engine")
    current_platform().check_and_update_config(config)
    hf_config = get_hf_config(config.model_config.model)
    config.resolve(hf_config)
    return hf_config


class EngineCore:
    """Holds the scheduler and the executor; drives one step at a time."""

    def __init__(self, config: BrigadeConfig):
        self.config = config
        hf_config = prepare_config(config)
        self.executor = Executor.get_class(config)(config, hf_config)
        num_blocks = self.executor.determine_num_kv_blocks()
        self.executor.initialize_kv_cache(num_blocks)
        block_size = config.cache_config.block_size
        max_model_len = config.model_config.max_model_len
        logger.info("KV cache: %d blocks of %d tokens (%d tokens); maximum concurrency %.2fx at %d tokens "
                    "per request", num_blocks, block_size, num_blocks * block_size,
                    num_blocks * block_size / max_model_len, max_model_len)
        self.scheduler = Scheduler(config.scheduler_config, config.cache_config, max_model_len=max_model_len,
                                   num_blocks=num_blocks)
        self.num_blocks = num_blocks

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request.from_engine_core_request(request, self.config.model_config.max_model_len))

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        """Abort requests; returns an ABORT output for each that was still unfinished."""
        finished = self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        return [EngineCoreOutput(request_id=r.request_id, new_token_ids=[], finish_reason=r.get_finish_reason())
                for r in finished]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, and update request states: one iteration of continuous batching."""
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs()
        scheduler_output = self.scheduler.schedule()
        runner_output = self.executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def call_utility(self, method: UtilityMethod):
        """Answer a control call from the front end."""
        kv = self.scheduler.kv_cache_manager
        if method == UtilityMethod.RESET_PREFIX_CACHE:
            return kv.reset_prefix_cache()
        if method == UtilityMethod.GET_KV_CACHE_STATS:
            return {"num_free_blocks": kv.get_num_free_blocks(), "num_total_blocks": kv.num_usable_blocks}
        if method == UtilityMethod.IS_SLEEPING:
            return False
        raise ValueError(f"unknown utility method {method!r}")

    def shutdown(self) -> None:
        self.executor.shutdown()
