"""EngineCore: the busy loop's body. One ``step()`` is schedule, execute, update.

It lives in its own process behind ZMQ when serving (engine/core_proc.py), or in the caller's process
for the offline LLM class. Either way it sees only EngineCoreRequest messages and returns
EngineCoreOutputs.
"""

from __future__ import annotations

import collections
import logging

from brigade.config import MIN_KV_BLOCKS, BrigadeConfig, ConfigError
from brigade.core.request import Request, RequestStatus
from brigade.core.scheduler import Scheduler
from brigade.engine.placement import check_device_count
from brigade.executor.abstract import Executor
from brigade.interfaces import (AsyncModelRunnerOutput, EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest,
                                FinishReason, SchedulerOutput, UtilityMethod)
from brigade.interfaces.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheGroup, cdiv, group_layers
from brigade.kv_transfer import KVConnectorRole, make_kv_connector
from brigade.lora.request import lora_module_requests
from brigade.structured_output import StructuredOutputManager
from brigade.utils import freeze_gc_heap

logger = logging.getLogger("brigade.engine")


def prepare_config(config: BrigadeConfig):
    """Load plugins, let the platform fill in its choices, resolve model-dependent limits, and let the model's
    class refuse a config it cannot run (``loader.check_model_config``: one ConfigError line), and, under ``-tp``,
    a quantization method a layer split it cannot take (``loader.check_quantized_layers``).

    Returns the model's HF config. Safe to call in every process that builds an engine.

    Raises:
        ConfigError: a setting the platform or the model refuses, or more devices needed than visible.
    """
    from brigade.model_executor.loader import check_model_config, check_quantized_layers, get_hf_config
    from brigade.plugins import current_platform, load_plugins

    load_plugins("engine")
    platform = current_platform()
    platform.check_and_update_config(config)
    check_device_count(config, platform)  # dp x tp x pp in the front end, tp x pp in an engine process
    hf_config = get_hf_config(config.model_config.model, config.model_config.trust_remote_code)
    config.resolve(hf_config)
    check_model_config(hf_config, config)
    check_parallel_architecture(config, hf_config)
    tp = config.parallel_config.tensor_parallel_size
    if tp > 1:  # a quantized layer the split would cut: one line here, not a worker's traceback
        check_quantized_layers(config.model_config, hf_config, tensor_parallel_size=tp)
    return hf_config


def check_parallel_architecture(config: BrigadeConfig, hf_config) -> None:
    """Refuse tensor (pipeline) parallelism for a model class that does not shard its layers (split them into
    stages): no ``tensor_parallel`` (``pipeline_parallel``) in its ``ModelCapabilities``, in one line, before
    anything loads; ``--enable-expert-parallel`` for a model without experts (no ``expert_parallel``;
    vLLM ignores the flag there with a log line, Brigade refuses it so that a typo'd model path is not silent).

    Raises:
        ConfigError: naming the architecture.
    """
    from brigade.model_executor.loader import get_model_class

    tp, pp = config.parallel_config.tensor_parallel_size, config.parallel_config.pipeline_parallel_size
    if config.parallel_config.enable_expert_parallel:
        model_cls = get_model_class(hf_config)
        if not model_cls.capabilities.expert_parallel:
            raise ConfigError(f"--enable-expert-parallel applies to mixture-of-experts models; {model_cls.__name__} "
                              "has no experts, so drop the flag")
    if tp > 1 or pp > 1:
        model_cls = get_model_class(hf_config)
        if tp > 1 and not model_cls.capabilities.tensor_parallel:
            raise ConfigError(f"{model_cls.__name__} does not shard its layers, so it cannot run with tensor "
                              f"parallelism (-tp {tp}); serve it with -tp 1")
        if pp > 1 and not model_cls.capabilities.pipeline_parallel:
            raise ConfigError(f"{model_cls.__name__} does not split its layers into stages, so it cannot run with "
                              f"pipeline parallelism (-pp {pp}); serve it with -pp 1")


def check_kv_capacity(num_blocks: int, block_size: int, max_model_len: int,
                      groups: tuple[KVCacheGroup, ...] | None = None, max_num_batched_tokens: int = 8192) -> int:
    """Refuse a KV cache that cannot hold one request of ``max_model_len`` tokens (as vLLM does at start-up).

    Such a request could never be scheduled, even with every other request preempted, and would wait at the
    head of the queue forever, holding everyone behind it (or, once running, preempt itself at every step).
    Block 0 is the pool's null block (``BlockPool``), so ``num_blocks - 1`` blocks hold tokens. The request
    holds at most ``spec.max_blocks_per_request`` blocks in each KV cache group at once (a sliding-window group
    about its window plus one step's chunk of ``max_num_batched_tokens``), all from the one pool.

    Args:
        groups: the model's KV cache groups; None: one full-attention group (what serve checks before the model
            loads: no hybrid model needs fewer blocks).
    Returns:
        The blocks one request of ``max_model_len`` tokens holds at most, every group together.
    Raises:
        ConfigError: naming the capacity and both ways out.
    """
    usable = num_blocks - 1
    if usable < 1:  # no --max-model-len fits: only more memory helps
        raise ConfigError(f"the KV cache has no usable block ({num_blocks} blocks of {block_size} tokens; block 0 is "
                          f"the null block, which never holds tokens), and it needs at least {MIN_KV_BLOCKS} blocks; "
                          f"give the cache more memory (--kv-cache-memory, --gpu-memory-utilization, "
                          f"--num-gpu-blocks-override {MIN_KV_BLOCKS} or more)")
    single = groups is None or (len(groups) == 1 and isinstance(groups[0].spec, FullAttentionSpec))
    if single:
        needed = cdiv(max_model_len, block_size)
    else:
        needed = sum(g.spec.max_blocks_per_request(max_model_len, max_num_batched_tokens) for g in groups)
    if needed <= usable:
        return needed
    blocks = f"{usable} usable block{'' if usable == 1 else 's'} of {block_size}"
    if single:
        raise ConfigError(f"the KV cache holds {usable * block_size} tokens ({blocks}), fewer than "
                          f"one request of --max-model-len {max_model_len}; give the cache more memory "
                          f"(--kv-cache-memory, --gpu-memory-utilization, --num-gpu-blocks-override) or set "
                          f"--max-model-len {usable * block_size} or less")
    kinds = ", ".join(f"{g.spec.kind} {len(g.layer_ids)} layers" for g in groups)
    raise ConfigError(f"the KV cache has {blocks} tokens, fewer than the {needed} blocks one request of "
                      f"--max-model-len {max_model_len} holds across the model's {len(groups)} KV cache groups "
                      f"({kinds}); give the cache more memory (--kv-cache-memory, --gpu-memory-utilization, --num-gpu-blocks-override "
                      f"{needed + 1} or more) or set a smaller --max-model-len")


def log_kv_cache(num_blocks: int, groups: tuple[KVCacheGroup, ...], max_model_len: int, per_request: int) -> None:
    """One INFO line: the pool, and how many requests of ``max_model_len`` tokens it holds at once."""
    block_size = groups[0].spec.block_size
    if len(groups) == 1 and isinstance(groups[0].spec, FullAttentionSpec):
        logger.info("KV cache: %d blocks of %d tokens (%d tokens); maximum concurrency %.2fx at %d tokens "
                    "per request", num_blocks, block_size, num_blocks * block_size,
                    num_blocks * block_size / max_model_len, max_model_len)
        return
    kinds = collections.Counter(g.spec.kind for g in groups)
    logger.info("KV cache: %d blocks of %d tokens shared by %d groups (%s); a request of %d tokens holds at most %d "
                "blocks; maximum concurrency %.2fx", num_blocks, block_size, len(groups),
                ", ".join(f"{n} {kind}" for kind, n in kinds.items()), max_model_len, per_request,
                (num_blocks - 1) / per_request)


class EngineCore:
    """Holds the scheduler and the executor; drives one step at a time."""

    def __init__(self, config: BrigadeConfig):
        self.config = config
        hf_config = prepare_config(config)
        self.executor = Executor.get_class(config)(config, hf_config)
        groups = self._kv_cache_groups()
        num_blocks = self.executor.determine_num_kv_blocks(groups)
        block_size = config.cache_config.block_size
        max_model_len = config.model_config.max_model_len
        per_request = check_kv_capacity(num_blocks, block_size, max_model_len, groups,
                                        config.scheduler_config.max_num_batched_tokens or 8192)
        self.kv_cache_config = KVCacheConfig(num_blocks, groups)  # the pool and its groups (benchmarks read it)
        self.executor.initialize_kv_cache(self.kv_cache_config)
        log_kv_cache(num_blocks, groups, max_model_len, per_request)
        self.structured_output_manager = StructuredOutputManager.from_config(config, hf_config)
        kv_connector = None
        if config.kv_transfer_config is not None:  # its worker-role peer was made with the KV cache
            kv_connector = make_kv_connector(config.kv_transfer_config, KVConnectorRole.SCHEDULER,
                                             self.executor.kv_cache_layout())
            logger.info("KV connector %s (%s)", config.kv_transfer_config.kv_connector,
                        config.kv_transfer_config.kv_role)
        self.scheduler = Scheduler(config.scheduler_config, config.cache_config, max_model_len=max_model_len,
                                   num_blocks=num_blocks, structured_output_manager=self.structured_output_manager,
                                   lora_config=config.lora_config,
                                   speculative_config=config.speculative_config, kv_connector=kv_connector,
                                   pipeline=config.parallel_config.pipeline_parallel_size > 1,
                                   kv_cache_specs=[group.spec for group in groups])
        self.num_blocks = num_blocks
        from brigade.plugins import current_platform

        overlap = config.scheduler_config.async_scheduling  # None: the platform's capability decides
        self.overlap = current_platform().supports_async_scheduling() if overlap is None else overlap
        if self.overlap and config.speculative_config is not None:
            # The next step's drafts come from this step's accepted tokens, so it cannot be planned before
            # they are known (vLLM v1 also ran speculation without async scheduling at first).
            logger.info("speculative decoding: overlapped (async) scheduling is off; steps run one at a time")
            self.overlap = False
        if self.overlap and config.parallel_config.data_parallel_lockstep:
            # Each loop turn of a lockstep engine is exactly one forward pass, agreed with the other engines.
            logger.info("expert parallelism across -dp engines: overlapped (async) scheduling is off")
            self.overlap = False
        # The step launched last, when overlapping: its plan and the handle of its output still on the device.
        self._in_flight: tuple[SchedulerOutput, AsyncModelRunnerOutput] | None = None
        # Under pipeline parallelism, up to one step per stage in flight, oldest first (vLLM v1's batch queue).
        self.batch_queue_size = config.parallel_config.pipeline_parallel_size
        self._batch_queue: collections.deque[tuple[SchedulerOutput, AsyncModelRunnerOutput]] = collections.deque()
        self.peak_batches_in_flight = 0  # the most batches the queue held at once (pp when stages overlap)
        # LoRA adapters registered in the workers, lora_int_id -> name (the --lora-modules ones to start with),
        # and those unloaded whose weights wait for their last requests to finish.
        self.loras: dict[int, str] = {} if config.lora_config is None else {
            r.lora_int_id: r.lora_name for r in lora_module_requests(config.lora_config.lora_modules).values()}
        self.loras_to_remove: set[int] = set()
        logger.debug("froze %d start-up objects out of the garbage collector's reach", freeze_gc_heap())

    def _kv_cache_groups(self) -> tuple[KVCacheGroup, ...]:
        """The model's KV cache groups, from every worker's layer specs (``group_layers``).

        Raises:
            ConfigError: layers whose blocks differ in size, or several groups with a KV connector (connectors move
                one block table a request).
        """
        try:
            groups = group_layers(self.executor.kv_cache_specs())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if len(groups) > 1 and self.config.kv_transfer_config is not None:
            counts = collections.Counter(group.spec.kind for group in groups)
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
            raise ConfigError(f"--kv-transfer-config: KV connectors move one block table a request, and this model's "
                              f"layers form {len(groups)} KV cache groups ({kinds}); serve it without a KV connector, "
                              "or a model whose attention layers all match")
        return groups

    def add_request(self, request: EngineCoreRequest) -> EngineCoreOutput | None:
        """Queue a request. Returns None, or, for a request on a LoRA adapter that is not registered or is being
        unloaded (a front end that let it through after the unload), its ABORT output: it is not queued (the
        runner would fail on an adapter it does not hold)."""
        lora_int_id = request.lora_int_id
        if lora_int_id is not None and (lora_int_id not in self.loras or lora_int_id in self.loras_to_remove):
            logger.warning("request %s names LoRA adapter %r (id %d), which is not loaded; it is aborted",
                           request.request_id, request.lora_name, lora_int_id)
            return EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ABORT)
        self.scheduler.add_request(Request.from_engine_core_request(request, self.config.model_config.max_model_len))
        return None

    def add_requests(self, requests: list[EngineCoreRequest]) -> list[EngineCoreOutput]:
        """``add_request`` for each; returns the ABORT outputs of those refused."""
        return [refused for refused in map(self.add_request, requests) if refused is not None]

    def add_lora(self, lora_request) -> bool:
        """Register a LoRA adapter (``brigade.lora.LoRARequest``) with the workers under its ``lora_int_id``
        (loaded and checked now); False when that id is already registered.

        Raises:
            LoRAError: the adapter cannot be served, or LoRA is not enabled.
        """
        if lora_request.lora_int_id in self.loras:
            return False
        added = self.executor.add_lora(lora_request)
        if added:
            self.loras[lora_request.lora_int_id] = lora_request.lora_name
        return added

    def remove_lora(self, lora_int_id: int) -> bool:
        """Unload a LoRA adapter: the workers drop its weights as soon as no unfinished request (running,
        waiting or preempted) runs on it, now when none does; requests already queued on it finish on it.
        A request for it arriving later is aborted (``add_request``); the front ends send none.

        Returns:
            False when no adapter has that id (or it is already being unloaded).
        """
        if lora_int_id not in self.loras or lora_int_id in self.loras_to_remove:
            return False
        self.loras_to_remove.add(lora_int_id)
        self._remove_unused_loras()
        return True

    def _remove_unused_loras(self) -> None:
        """Drop from the workers the unloaded adapters no unfinished request runs on. A step already launched
        (overlapped scheduling) may still use one: the workers run the removal after it, in order."""
        in_use = self.scheduler.lora_ids_in_use()
        for lora_int_id in sorted(self.loras_to_remove - in_use):
            self.executor.remove_lora(lora_int_id)
            self.loras_to_remove.discard(lora_int_id)
            logger.info("LoRA adapter %r (id %d): weights dropped, no request runs on it any more",
                        self.loras.pop(lora_int_id), lora_int_id)

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        """Abort requests; returns an ABORT output for each that was still unfinished."""
        finished = self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        return [EngineCoreOutput(request_id=r.request_id, new_token_ids=[], finish_reason=r.get_finish_reason())
                for r in finished]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None or bool(self._batch_queue)

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, and update request states: one iteration of continuous batching. Then drop
        the unloaded LoRA adapters whose last requests finished."""
        outputs = self._step()
        if self.loras_to_remove:
            self._remove_unused_loras()
        return outputs

    def _step(self) -> EngineCoreOutputs:
        if self.batch_queue_size > 1:
            return self._step_with_batch_queue()
        if self.overlap:
            return self._step_overlapped()
        if self._in_flight is not None:
            return self._finish_in_flight()
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs()
        scheduler_output = self.scheduler.schedule()
        runner_output = self.executor.execute_model(scheduler_output)
        self._maybe_wait_for_grammars(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def execute_dummy_batch(self) -> None:
        """Run one forward pass of a dummy token on the workers, nothing scheduled: a lockstep data-parallel
        engine with no request runs it while another engine steps (``engine/dp_lockstep.py``)."""
        self.executor.execute_dummy_batch()

    def _step_with_batch_queue(self) -> EngineCoreOutputs:
        """Pipeline parallelism: launch a new batch while fewer than ``pp`` are in flight, else finish the oldest
        (vLLM v1's ``step_with_batch_queue``). The scheduler puts a request that samples in one batch at a time
        (``Scheduler(pipeline=True)``), so the batches in flight hold different requests (or later prompt
        chunks) and stage 0 starts batch N+1 while the last stage still runs batch N.
        """
        queue = self._batch_queue
        if len(queue) < self.batch_queue_size and self.scheduler.has_unfinished_requests():
            scheduler_output = self.scheduler.schedule()
            if (scheduler_output.total_num_scheduled_tokens or scheduler_output.finished_req_ids
                    or scheduler_output.preempted_req_ids):  # the workers must learn of those too
                queue.append((scheduler_output, self.executor.execute_model(scheduler_output, overlap=True)))
                self.peak_batches_in_flight = max(self.peak_batches_in_flight, len(queue))
                if len(queue) < self.batch_queue_size and scheduler_output.total_num_scheduled_tokens:
                    return EngineCoreOutputs()  # room for one more batch before waiting on the oldest
            elif not queue:
                self._maybe_wait_for_grammars(scheduler_output)
        if not queue:
            return EngineCoreOutputs()
        scheduler_output, pending = queue.popleft()
        return self.scheduler.update_from_output(scheduler_output, pending.get())

    def _maybe_wait_for_grammars(self, scheduler_output) -> None:
        """When only requests with compiling grammars are left, sleep on their compiles, not in a spin."""
        if scheduler_output.total_num_scheduled_tokens == 0 and self.structured_output_manager is not None:
            self.structured_output_manager.wait_for_compiles(timeout_s=0.05)

    def _step_overlapped(self) -> EngineCoreOutputs:
        """Launch step N+1, then finish step N while the device runs it (asynchronous scheduling).

        The scheduler counts step N's samples as placeholders, so it can plan N+1 before their values are
        known; stop conditions are therefore applied one step late and a finished request may compute one
        extra token, which is dropped.
        """
        launched = None
        if self.scheduler.has_unfinished_requests():
            scheduler_output = self.scheduler.schedule()
            if scheduler_output.total_num_scheduled_tokens:
                launched = (scheduler_output, self.executor.execute_model(scheduler_output, overlap=True))
        outputs = self._finish_in_flight()
        self._in_flight = launched
        return outputs

    def _finish_in_flight(self) -> EngineCoreOutputs:
        if self._in_flight is None:
            return EngineCoreOutputs()
        scheduler_output, pending = self._in_flight
        self._in_flight = None
        return self.scheduler.update_from_output(scheduler_output, pending.get())

    def call_utility(self, method: UtilityMethod, lora_request=None):
        """Answer a control call from the front end (``lora_request``: the adapter of ADD_LORA, REMOVE_LORA).

        Raises:
            LoRAError: ADD_LORA of an adapter that cannot be served (or without LoRA enabled).
        """
        if method == UtilityMethod.ADD_LORA:
            return self.add_lora(lora_request)
        if method == UtilityMethod.REMOVE_LORA:
            return self.remove_lora(lora_request.lora_int_id)
        kv = self.scheduler.kv_cache_manager
        if method == UtilityMethod.RESET_PREFIX_CACHE:
            return kv.reset_prefix_cache()
        if method == UtilityMethod.GET_KV_CACHE_STATS:
            return {"num_free_blocks": kv.get_num_free_blocks(), "num_total_blocks": kv.num_usable_blocks}
        if method == UtilityMethod.IS_SLEEPING:
            return False
        raise ValueError(f"unknown utility method {method!r}")

    def shutdown(self) -> None:
        if self.structured_output_manager is not None:
            self.structured_output_manager.shutdown()
        if self.scheduler.kv_connector is not None:
            self.scheduler.kv_connector.shutdown()
        self.executor.shutdown()
