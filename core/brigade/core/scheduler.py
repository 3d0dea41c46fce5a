"""Scheduler: continuous batching at the level of single steps (book ch. 4).

Each step it gives every running request, then waiting ones, a number of new tokens within the token
budget (``max_num_batched_tokens``) and ``max_num_seqs``. Prefill chunks and decodes mix freely: a request
needing one token is decoding, one needing more is (still) prefilling. When KV blocks run out, the last
running request is preempted: its blocks are freed and it is recomputed later. The scheduler decides
*what* runs; it never touches tensors. With LoRA it only knows each request's adapter name: a waiting
request whose adapter would make more than ``max_loras`` distinct adapters among the running requests waits
(the others behind it may go), as in vLLM.
"""

from __future__ import annotations

import time

from brigade.config import CacheConfig, LoRAConfig, SchedulerConfig
from brigade.core.kv_cache_manager import KVCacheManager
from brigade.core.request import Request, RequestStatus
from brigade.core.request_queue import make_request_queue
from brigade.core.scheduler_output import (CachedRequestData, ModelRunnerOutput, NewRequestData,
                                           SchedulerOutput)
from brigade.engine.messages import (EngineCoreOutput, EngineCoreOutputs, FinishReason, LogprobsLists,
                                     SchedulerStats)


def _count_loras(requests) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request in requests:
        if request.lora_name is not None:
            counts[request.lora_name] = counts.get(request.lora_name, 0) + 1
    return counts


class Scheduler:
    """Owns every unfinished request and the KV cache manager.

    Invariant: ``requests`` holds exactly the requests in ``waiting`` or ``running``; running requests are
    the ones holding KV blocks.
    """

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, *, max_model_len: int,
                 num_blocks: int, structured_output_manager=None, lora_config: LoRAConfig | None = None):
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
        # Structured output (brigade.structured_output): compiles grammars, fills bitmasks, advances matchers.
        self.structured_output_manager = structured_output_manager
        self.grammar_failures: list[EngineCoreOutput] = []  # reported by the next update_from_output
        self.num_prompt_logprobs_sent: dict[str, int] = {}  # prompt_logprobs rows delivered, per request
        self.num_overlap_unsafe = 0  # unfinished requests that need the previous token before scheduling
        self.max_loras = lora_config.max_loras if lora_config is not None else None

    # ---- requests in and out --------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add(request)
        if self.structured_output_manager is not None and request.sampling_params.structured_outputs is not None:
            self.structured_output_manager.add_request(request.request_id, request.sampling_params.structured_outputs)
        self.num_overlap_unsafe += not request.overlap_safe

    def all_overlap_safe(self) -> bool:
        """True when every unfinished request may be scheduled before its last token is known."""
        return self.num_overlap_unsafe == 0

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
        self.num_overlap_unsafe -= not request.overlap_safe
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        if self.structured_output_manager is not None:
            self.structured_output_manager.remove_request(request.request_id)
        self.num_prompt_logprobs_sent.pop(request.request_id, None)
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
            if num_new == 0:
                index += 1
                continue
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
        grammar_blocked: list[Request] = []  # still compiling (or a LoRA without a slot): set aside, in order
        active_loras = {r.lora_name for r in self.running if r.lora_name is not None}
        while not preempted and len(self.waiting) and budget > 0 \
                and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            if self._grammar_blocks(request) or self._lora_blocks(request, active_loras):
                grammar_blocked.append(self.waiting.pop())
                continue
            if request.num_output_placeholders:
                break  # preempted with a token still in flight: resume once it is known
            hit_blocks, num_hit = self.kv_cache_manager.get_computed_blocks(request)
            if request.sampling_params.prompt_logprobs is not None:
                hit_blocks, num_hit = [], 0  # cached prompt tokens are never computed, so they get no logprobs
            num_new = request.num_tokens - num_hit
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = self._cap_chunk(num_new, budget)
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new, hit_blocks, num_hit)
            if new_blocks is None:
                break
            self.waiting.pop()
            self.running.append(request)
            if request.lora_name is not None:
                active_loras.add(request.lora_name)
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
                num_computed_tokens=num_hit, lora_name=request.lora_name))

        for request in reversed(grammar_blocked):
            if not request.is_finished():
                self.waiting.prepend(request)
        structured_ids = self._structured_sampling_ids(num_scheduled)
        for req_id, num_new in num_scheduled.items():
            request = self.requests[req_id]
            request.num_computed_tokens += num_new
            if request.num_computed_tokens == request.num_tokens_with_placeholders:
                request.num_output_placeholders += 1  # this step samples its next token
        output = SchedulerOutput(new_reqs, cached, num_scheduled, sum(num_scheduled.values()),
                                 self.finished_req_ids, preempted)
        if structured_ids:
            output.structured_output_req_ids = structured_ids
            output.grammar_bitmask = self.structured_output_manager.grammar_bitmask(structured_ids)
        self.finished_req_ids = set()
        return output

    def _lora_blocks(self, request: Request, active_loras: set[str]) -> bool:
        """True when admitting ``request`` would put more than ``max_loras`` distinct adapters in the running
        batch (``active_loras``: the adapters of the running requests)."""
        name = request.lora_name
        return (name is not None and self.max_loras is not None and name not in active_loras
                and len(active_loras) >= self.max_loras)

    def _cap_chunk(self, num_new: int, budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0 and len(self.running) + len(self.waiting) > 1:
            num_new = min(num_new, threshold)
        return min(num_new, budget)

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        if request.num_output_tokens + request.num_output_placeholders >= request.max_tokens:
            return 0  # its last token is still in flight
        return self._cap_chunk(request.num_tokens_with_placeholders - request.num_computed_tokens, budget)

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
        """Free a running request's blocks and requeue it at the front; it will be recomputed.

        A token still in flight for it keeps its placeholder until update_from_output appends it.
        """
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
        outputs, self.grammar_failures = self.grammar_failures, []
        for req_id, token_ids in zip(runner_output.req_ids, runner_output.sampled_token_ids):
            request = self.requests.get(req_id)
            prompt_logprobs = self._new_prompt_logprobs(request, scheduler_output, runner_output)
            if request is None or not token_ids:
                if prompt_logprobs is not None:  # mid-prefill: this chunk's prompt logprobs go out now
                    outputs.append(EngineCoreOutput(request_id=req_id, new_token_ids=[],
                                                    prompt_logprobs=prompt_logprobs))
                continue  # aborted meanwhile, or mid-prefill
            request.num_output_placeholders = max(0, request.num_output_placeholders - len(token_ids))
            was_running = request.status == RequestStatus.RUNNING
            request.append_output_token_ids(token_ids)
            self._check_stop(request)
            self._maybe_advance_grammar(request, token_ids)
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=token_ids, new_logprobs=runner_output.logprobs.get(req_id),
                prompt_logprobs=prompt_logprobs,
                finish_reason=request.get_finish_reason(), stop_reason=request.stop_reason,
                num_cached_tokens=max(request.num_cached_tokens, 0)))
            if request.is_finished():
                # A request preempted while its token was in flight finishes from the waiting queue.
                (self.running if was_running else self.waiting).remove(request)
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

    def _new_prompt_logprobs(self, request: Request | None, scheduler_output: SchedulerOutput,
                             runner_output: ModelRunnerOutput) -> LogprobsLists | None:
        """The runner's prompt logprobs for a request, minus rows already delivered: a preempted request
        recomputes its prompt from the start, and its client must see each prompt token once."""
        lists = runner_output.prompt_logprobs.get(request.request_id) if request is not None else None
        if lists is None:
            return None
        rid = request.request_id
        first = request.num_computed_tokens - scheduler_output.num_scheduled_tokens[rid] + 1  # first row's token
        sent = self.num_prompt_logprobs_sent.get(rid, 0)  # rows for tokens 1..sent are out
        skip = max(0, sent + 1 - first)
        self.num_prompt_logprobs_sent[rid] = max(sent, first - 1 + len(lists.ranks))
        if skip >= len(lists.ranks):
            return None
        return LogprobsLists(lists.token_ids[skip:], lists.logprobs[skip:], lists.ranks[skip:])

    # ---- structured output (the StructuredOutputManager does the grammar work) --------------------
    def _grammar_blocks(self, request: Request) -> bool:
        """True when a waiting request may not be admitted because of its grammar: still compiling, or
        failed (then the request is finished as aborted and reported by the next update_from_output)."""
        manager = self.structured_output_manager
        if manager is None or not manager.has_request(request.request_id):
            return False
        if manager.is_waiting_for_grammar(request.request_id):
            return True
        error = manager.take_failure(request.request_id)
        if error is None:
            return False
        request.status = RequestStatus.FINISHED_ABORTED
        self._free_request(request)
        self.grammar_failures.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                                      finish_reason=FinishReason.ABORT, stop_reason=error))
        return True

    def _structured_sampling_ids(self, num_scheduled: dict[str, int]) -> list[str]:
        """Constrained requests that sample this step (their computed tokens reach num_tokens), before the
        step's counters move. They are never overlap-safe, so no token of theirs is in flight."""
        manager = self.structured_output_manager
        if manager is None:
            return []
        return [rid for rid, n in num_scheduled.items() if manager.has_request(rid)
                and self.requests[rid].num_computed_tokens + n == self.requests[rid].num_tokens]

    def _maybe_advance_grammar(self, request: Request, token_ids: list[int]) -> None:
        """Feed the step's tokens to the request's matcher; a completed grammar stops the request."""
        manager = self.structured_output_manager
        if manager is None or request.is_finished() or not manager.has_request(request.request_id):
            return
        if not manager.accept_tokens(request.request_id, token_ids):
            request.status = RequestStatus.FINISHED_ABORTED  # another mask left no token the grammar allows
            request.stop_reason = "the sampled token violates the output grammar"
        elif manager.is_terminated(request.request_id):
            request.status = RequestStatus.FINISHED_STOPPED

    def make_stats(self, scheduler_output: SchedulerOutput | None = None) -> SchedulerStats:
        queries, hits = self.kv_cache_manager.take_prefix_cache_stats()
        stats = SchedulerStats(
            num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage, prefix_cache_queries=queries,
            prefix_cache_hits=hits, num_preemptions=self.num_preemptions,
            num_scheduled_tokens=scheduler_output.total_num_scheduled_tokens if scheduler_output else 0,
            num_free_blocks=self.kv_cache_manager.get_num_free_blocks(),
            num_total_blocks=self.kv_cache_manager.num_usable_blocks)
        if self.max_loras is not None:
            stats.running_lora_adapters = _count_loras(self.running)
            stats.waiting_lora_adapters = _count_loras(self.waiting)
        self.num_preemptions = 0
        return stats
