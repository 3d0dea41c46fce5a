"""Scheduler: continuous batching at the level of single steps (book ch. 4).

Each step it gives every running request, then waiting ones, a number of new tokens within the token
budget (``max_num_batched_tokens``) and ``max_num_seqs``. Prefill chunks and decodes mix freely: a request
needing one token is decoding, one needing more is (still) prefilling. When KV blocks run out, the last
running request is preempted: its blocks are freed and it is recomputed later. The scheduler decides
*what* runs; it never touches tensors.
"""

from __future__ import annotations

import time

from brigade.config import CacheConfig, SchedulerConfig
from brigade.core.kv_cache_manager import KVCacheManager
from brigade.core.request import Request, RequestStatus
from brigade.core.request_queue import make_request_queue
from brigade.core.scheduler_output import (CachedRequestData, ModelRunnerOutput, NewRequestData,
                                           SchedulerOutput)
from brigade.engine.messages import EngineCoreOutput, EngineCoreOutputs, SchedulerStats


class Scheduler:
    """Owns every unfinished request and the KV cache manager.

    Invariant: ``requests`` holds exactly the requests in ``waiting`` or ``running``; running requests are
    the ones holding KV blocks.
    """

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, *, max_model_len: int,
                 num_blocks: int):
        self.config = scheduler_config
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = scheduler_config.max_num_batched_tokens or 8192
        assert cache_config.block_size is not None, "the platform must set the block size"
        self.kv_cache_manager = KVCacheManager(num_blocks, cache_config.block_size,
                                               cache_config.enable_prefix_caching,
                                               cache_config.prefix_caching_hash_algo)
        self.requests: dict[str, Request] = {}
        self.waiting = make_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # told to the runner on the next schedule()
        self.num_preemptions = 0  # since the last make_stats()
        self.num_preemptions_total = 0  # since start

    # ---- requests in and out --------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]:
        """Finish requests from outside the step (abort, stop string found by the front end)."""
        finished = []
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)
            finished.append(request)
        return finished

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- one step -------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan one step: running requests first, then waiting ones, preempting on block shortage."""
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        cached = CachedRequestData.make_empty()
        new_reqs: list[NewRequestData] = []
        preempted: set[str] = set()

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = self._num_new_tokens(request, budget)
            new_blocks = self._allocate_or_preempt(request, num_new, preempted)
            if new_blocks is None:
                break  # the request itself was preempted
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            cached.req_ids.append(request.request_id)
            cached.new_block_ids.append([b.block_id for b in new_blocks])
            cached.num_computed_tokens.append(request.num_computed_tokens)
            index += 1

        # Admit waiting requests only when nothing was preempted: memory is short otherwise.
        while not preempted and len(self.waiting) and budget > 0 \
                and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            hit_blocks, num_hit = self.kv_cache_manager.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = self._cap_chunk(num_new, budget)
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new, hit_blocks, num_hit)
            if new_blocks is None:
                break
            self.waiting.pop()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            new_reqs.append(NewRequestData(
                req_id=request.request_id, token_ids=list(request.all_token_ids),
                num_prompt_tokens=request.num_prompt_tokens, sampling_params=request.sampling_params,
                eos_token_id=request.eos_token_id,
                block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
                num_computed_tokens=num_hit))

        for req_id, num_new in num_scheduled.items():
            self.requests[req_id].num_computed_tokens += num_new
        output = SchedulerOutput(new_reqs, cached, num_scheduled, sum(num_scheduled.values()),
                                 self.finished_req_ids, preempted)
        self.finished_req_ids = set()
        return output

    def _cap_chunk(self, num_new: int, budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0 and len(self.running) + len(self.waiting) > 1:
            num_new = min(num_new, threshold)
        return min(num_new, budget)

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        return self._cap_chunk(request.num_tokens - request.num_computed_tokens, budget)

    def _allocate_or_preempt(self, request: Request, num_new: int, preempted: set[str]):
        """Allocate slots, preempting from the tail of ``running`` until it fits or ``request`` goes."""
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new)
            if new_blocks is not None:
                return new_blocks
            victim = self.running.pop()
            self._preempt(victim)
            preempted.add(victim.request_id)
            if victim is request:
                return None

    def _preempt(self, request: Request) -> None:
        """Free a running request's blocks and requeue it at the front; it will be recomputed."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.prepend(request)

    # ---- results --------------------------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """Append sampled tokens, apply stop conditions, free finished requests, build the step's outputs."""
        outputs: list[EngineCoreOutput] = []
        for req_id, token_ids in zip(runner_output.req_ids, runner_output.sampled_token_ids):
            request = self.requests.get(req_id)
            if request is None or not token_ids:
                continue  # aborted meanwhile, or mid-prefill
            request.append_output_token_ids(token_ids)
            self._check_stop(request)
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=token_ids, new_logprobs=runner_output.logprobs.get(req_id),
                finish_reason=request.get_finish_reason(), stop_reason=request.stop_reason,
                num_cached_tokens=max(request.num_cached_tokens, 0)))
            if request.is_finished():
                self.running.remove(request)
                self._free_request(request)
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats(scheduler_output),
                                 timestamp=time.time())

    def _check_stop(self, request: Request) -> None:
        last = request.output_token_ids[-1]
        if request.num_output_tokens >= request.sampling_params.min_tokens and last in request.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            if last != request.eos_token_id:
                request.stop_reason = last
        elif request.num_output_tokens >= request.max_tokens or request.num_tokens >= self.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED

    def make_stats(self, scheduler_output: SchedulerOutput | None = None) -> SchedulerStats:
        queries, hits = self.kv_cache_manager.take_prefix_cache_stats()
        stats = SchedulerStats(
            num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage, prefix_cache_queries=queries,
            prefix_cache_hits=hits, num_preemptions=self.num_preemptions,
            num_scheduled_tokens=scheduler_output.total_num_scheduled_tokens if scheduler_output else 0,
            num_free_blocks=self.kv_cache_manager.get_num_free_blocks(),
            num_total_blocks=self.kv_cache_manager.num_usable_blocks)
        self.num_preemptions = 0
        return stats
