"""Scheduler: continuous batching at the level of single steps.

Each step it gives every running request, then waiting ones, a number of new tokens within the token
budget (``max_num_batched_tokens``) and ``max_num_seqs``. Prefill chunks and decodes mix freely: a request
needing one token is decoding, one needing more is (still) prefilling. When KV blocks run out, the last
running request is preempted: its blocks are freed and it is recomputed later. The scheduler decides
*what* runs; it never touches tensors. With LoRA it only knows each request's adapter name and id: a waiting
request whose adapter would make more than ``max_loras`` distinct adapters among the running requests waits
(the others behind it may go), as in vLLM; ``lora_ids_in_use`` tells the engine core which adapters it may
drop after an unload. A request the runner could not run (its adapter's evicted weights cannot be read again)
comes back in ``ModelRunnerOutput.failures`` (as not run) and is finished as aborted.

Speculative decoding (``--speculative-config``): after a step, ``update_from_output`` asks the
n-gram proposer (``brigade.spec_decode``) for draft tokens of each running request; the next ``schedule``
gives a decoding request with drafts 1 + k tokens (drafts capped by the token budget, max_tokens and
max_model_len) and KV slots for all of them, and sends the drafts down in
``SchedulerOutput.scheduled_spec_decode_tokens``. The runner returns the accepted drafts plus one token;
``num_computed_tokens`` rolls back over the rejected ones, whose KV slots are simply overwritten later. Block
hashes are only published for tokens in ``all_token_ids`` (never drafts), so the prefix cache never holds a
rejected token.

KV connector (``--kv-transfer-config``): the scheduler-role connector (``brigade.kv_transfer``) is
asked, for each waiting request being admitted, how many tokens beyond the local prefix-cache hit an external
store holds; those tokens get blocks and count as computed, the connector is told which blocks
(``update_state_after_alloc``), and its per-step metadata rides in ``SchedulerOutput.kv_connector_metadata`` to
the worker-role connector, which loads them before the forward pass and saves after it.
"""

from __future__ import annotations

import logging
import time

from brigade.config import CacheConfig, LoRAConfig, SchedulerConfig, SpeculativeConfig
from brigade.core.kv_cache_manager import KVCacheManager
from brigade.core.request import Request, RequestStatus
from brigade.core.request_queue import make_request_queue
from brigade.interfaces import (CachedRequestData, EngineCoreOutput, EngineCoreOutputs, FinishReason, LogprobsLists,
                                ModelRunnerOutput, NewRequestData, RequestFailure, SchedulerOutput, SchedulerStats,
                                SpecDecodingStats)
from brigade.kv_transfer.base import KVConnectorBase
from brigade.spec_decode import NgramProposer

logger = logging.getLogger("brigade.engine")


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
                 num_blocks: int, structured_output_manager=None, lora_config: LoRAConfig | None = None,
                 speculative_config: SpeculativeConfig | None = None, kv_connector: KVConnectorBase | None = None):
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
        self.proposer = NgramProposer.from_config(speculative_config) if speculative_config is not None else None
        self.num_spec_tokens = speculative_config.num_speculative_tokens if speculative_config is not None else 0
        self._reset_spec_stats()
        # Since start (tests, bench): drafts (steps of a request with drafts), draft tokens, accepted tokens.
        self.spec_totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self.kv_connector = kv_connector  # the scheduler-role KV connector, or None
        self.num_external_tokens_total = 0  # tokens a KV connector provided instead of computing them, since start

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
        if self.kv_connector is not None and self.kv_connector.request_finished(
                request, self.kv_cache_manager.get_block_ids(request.request_id)):
            raise NotImplementedError(f"KV connector {type(self.kv_connector).__name__} asked to keep the blocks of "
                                      f"request {request.request_id} for an asynchronous save; Brigade's connectors "
                                      "save within the step")
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
        spec_tokens: dict[str, list[int]] = {}

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = self._num_new_tokens(request, budget)
            if num_new == 0:
                index += 1
                continue
            drafts = self._schedulable_drafts(request, budget) if num_new == 1 else []
            new_blocks = None
            if drafts:  # drafts are optional work: short of blocks, run the plain decode before preempting anyone
                new_blocks = self.kv_cache_manager.allocate_slots(request, num_new + len(drafts))
                if new_blocks is None:
                    drafts = []
            num_new += len(drafts)
            if new_blocks is None:
                new_blocks = self._allocate_or_preempt(request, num_new, preempted)
            if new_blocks is None:
                break  # the request itself was preempted
            if drafts:
                spec_tokens[request.request_id] = drafts
            request.spec_token_ids = []  # consumed; update_from_output proposes the next ones
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            cached.req_ids.append(request.request_id)
            cached.new_block_ids.append([b.block_id for b in new_blocks])
            cached.num_computed_tokens.append(request.num_computed_tokens)
            index += 1

        # Admit waiting requests only when nothing was preempted: memory is short otherwise.
        grammar_blocked: list[Request] = []  # still compiling (or a LoRA without a slot): set aside, in order
        active_loras = {r.lora_key for r in self.running if r.lora_key is not None}
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
            num_external = self._num_external_tokens(request, num_hit)
            num_new = request.num_tokens - num_hit - num_external
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = self._cap_chunk(num_new, budget)
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new, hit_blocks, num_hit, num_external)
            if new_blocks is None:
                break
            self.waiting.pop()
            self.running.append(request)
            if request.lora_key is not None:
                active_loras.add(request.lora_key)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit
            block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
            if self.kv_connector is not None:
                self.kv_connector.update_state_after_alloc(request, block_ids, num_external)
                self.num_external_tokens_total += num_external
            request.num_computed_tokens = num_hit + num_external
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit + num_external
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            new_reqs.append(NewRequestData(
                req_id=request.request_id, token_ids=list(request.all_token_ids),
                num_prompt_tokens=request.num_prompt_tokens, sampling_params=request.sampling_params,
                eos_token_id=request.eos_token_id, block_ids=block_ids,
                num_computed_tokens=num_hit + num_external, lora_int_id=request.lora_int_id))

        for request in reversed(grammar_blocked):
            if not request.is_finished():
                self.waiting.prepend(request)
        structured_ids = self._structured_sampling_ids(num_scheduled)
        for req_id, num_new in num_scheduled.items():
            request = self.requests[req_id]
            request.num_computed_tokens += num_new
            num_drafts = len(spec_tokens.get(req_id, ()))
            if request.num_computed_tokens - num_drafts == request.num_tokens_with_placeholders:
                request.num_output_placeholders += 1  # this step samples its next token
        output = SchedulerOutput(new_reqs, cached, num_scheduled, sum(num_scheduled.values()),
                                 self.finished_req_ids, preempted, scheduled_spec_decode_tokens=spec_tokens)
        if self.kv_connector is not None:
            output.kv_connector_metadata = self.kv_connector.build_connector_meta(output)
        if structured_ids:
            output.structured_output_req_ids = structured_ids
            output.grammar_bitmask = self.structured_output_manager.grammar_bitmask(structured_ids)
        self.finished_req_ids = set()
        return output

    def _num_external_tokens(self, request: Request, num_hit: int) -> int:
        """Tokens of a waiting request after its local hit (``num_hit``) that the KV connector will load; 0 without
        a connector and for requests with prompt logprobs (loaded tokens are not computed, so get no logprobs).

        Raises:
            ValueError: the connector answered beyond ``num_tokens - 1`` or a negative count (a connector bug that
                would otherwise leave no token to sample from).
        """
        if self.kv_connector is None or request.sampling_params.prompt_logprobs is not None:
            return 0
        num_external = self.kv_connector.get_num_new_matched_tokens(request, num_hit)
        if num_external < 0 or num_hit + num_external > request.num_tokens - 1:
            raise ValueError(f"KV connector {type(self.kv_connector).__name__} matched {num_external} tokens of "
                             f"request {request.request_id} after {num_hit} local ones; at most "
                             f"{request.num_tokens - 1 - num_hit} (num_tokens - 1 in all) may be matched")
        return num_external

    def _lora_blocks(self, request: Request, active_loras: set[tuple]) -> bool:
        """True when admitting ``request`` would put more than ``max_loras`` distinct adapters in the running
        batch (``active_loras``: the ``lora_key`` of the running requests' adapters)."""
        key = request.lora_key
        return (key is not None and self.max_loras is not None and key not in active_loras
                and len(active_loras) >= self.max_loras)

    def lora_ids_in_use(self) -> set[int]:
        """The ``lora_int_id`` of every adapter an unfinished request (running, waiting or preempted) runs on:
        the adapters whose weights the workers must keep."""
        return {r.lora_int_id for r in self.requests.values() if r.lora_int_id is not None}

    def _cap_chunk(self, num_new: int, budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0 and len(self.running) + len(self.waiting) > 1:
            num_new = min(num_new, threshold)
        return min(num_new, budget)

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        if request.num_output_tokens + request.num_output_placeholders >= request.max_tokens:
            return 0  # its last token is still in flight
        return self._cap_chunk(request.num_tokens_with_placeholders - request.num_computed_tokens, budget)

    def _schedulable_drafts(self, request: Request, budget: int) -> list[int]:
        """The request's drafts that may run this step: only for a decode with its last token known, capped so
        that the step's tokens fit the budget (and the long-prefill threshold) and the up to k + 1 tokens it
        yields overrun neither max_tokens nor max_model_len."""
        drafts = request.spec_token_ids
        if not drafts or request.num_output_placeholders or request.num_tokens - request.num_computed_tokens != 1:
            return []
        room = min(request.max_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens) - 1
        return drafts[:max(0, min(room, self._cap_chunk(1 + len(drafts), budget) - 1))]

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
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.prepend(request)

    # ---- results --------------------------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """Append sampled tokens, apply stop conditions, free finished requests, build the step's outputs.
        Requests in ``failures`` are finished (aborted when they did not run, FINISHED_ERROR when they failed in
        the step), the reason as their ``stop_reason``."""
        outputs, self.grammar_failures = self.grammar_failures, []
        outputs += self._finish_failed(runner_output.failures)
        for req_id, token_ids in zip(runner_output.req_ids, runner_output.sampled_token_ids):
            request = self.requests.get(req_id)
            prompt_logprobs = self._new_prompt_logprobs(request, scheduler_output, runner_output)
            if request is None or not token_ids:
                if prompt_logprobs is not None:  # mid-prefill: this chunk's prompt logprobs go out now
                    outputs.append(EngineCoreOutput(request_id=req_id, new_token_ids=[],
                                                    prompt_logprobs=prompt_logprobs))
                continue  # aborted meanwhile, or mid-prefill
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if drafts:  # roll back over the rejected drafts: their KV slots are rewritten by later steps
                num_accepted = len(token_ids) - 1
                request.num_computed_tokens -= len(drafts) - num_accepted
                self._record_spec(len(drafts), num_accepted)
            request.num_output_placeholders = max(0, request.num_output_placeholders - len(token_ids))
            was_running = request.status == RequestStatus.RUNNING
            token_ids = self._append_until_stop(request, token_ids)
            self._maybe_advance_grammar(request, token_ids)
            new_logprobs = runner_output.logprobs.get(req_id)
            if new_logprobs is not None and len(new_logprobs.ranks) > len(token_ids):  # cut at a stop
                n = len(token_ids)
                new_logprobs = LogprobsLists(new_logprobs.token_ids[:n], new_logprobs.logprobs[:n],
                                             new_logprobs.ranks[:n])
            if self.proposer is not None and was_running and not request.is_finished():
                self._propose(request)
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=token_ids, new_logprobs=new_logprobs,
                prompt_logprobs=prompt_logprobs,
                finish_reason=request.get_finish_reason(), stop_reason=request.stop_reason,
                num_cached_tokens=max(request.num_cached_tokens, 0)))
            if request.is_finished():
                # A request preempted while its token was in flight finishes from the waiting queue.
                (self.running if was_running else self.waiting).remove(request)
                self._free_request(request)
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats(scheduler_output),
                                 timestamp=time.time())

    def _finish_failed(self, failures: dict[str, RequestFailure]) -> list[EngineCoreOutput]:
        """Finish the requests the runner left out of a step because they cannot run (aborted), then those that
        failed in it (FINISHED_ERROR: finish_reason "error"); their step's tokens are dropped. One already
        finished (aborted meanwhile, or reported by an earlier step) is skipped."""
        outputs = []
        for ran, status in ((False, RequestStatus.FINISHED_ABORTED), (True, RequestStatus.FINISHED_ERROR)):
            req_ids = [req_id for req_id, failure in failures.items() if failure.ran == ran]
            for request in self.finish_requests(req_ids, status):
                reason = failures[request.request_id].message
                logger.warning("request %s %s: %s", request.request_id, "failed" if ran else "is aborted", reason)
                outputs.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                                finish_reason=RequestStatus.finish_reason(status), stop_reason=reason))
        return outputs

    def _append_until_stop(self, request: Request, token_ids: list[int]) -> list[int]:
        """Append the step's tokens one by one, applying the stop conditions after each, as if they had come
        one step at a time; returns the tokens kept (those after a stop are dropped)."""
        if len(token_ids) == 1:
            request.append_output_token_ids(token_ids)
            self._check_stop(request)
            return token_ids
        for i, token in enumerate(token_ids):
            request.append_output_token_ids([token])
            self._check_stop(request)
            if request.is_finished():
                return token_ids[:i + 1]
        return token_ids

    # ---- speculative decoding -------------------------------------------------------------------
    def _propose(self, request: Request) -> None:
        """Draft tokens for the request's next step (n-gram lookup over prompt + output). Requests with a
        grammar get none: their next tokens' masks depend on each accepted token (vLLM checks drafts against
        the grammar; Brigade keeps it simple and does not speculate for them)."""
        if request.sampling_params.structured_outputs is not None:
            return
        room = min(request.max_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens) - 1
        request.spec_token_ids = self.proposer.propose(request.all_token_ids, room) if room > 0 else []

    def _reset_spec_stats(self) -> None:
        self.spec_num_drafts = self.spec_num_draft_tokens = self.spec_num_accepted_tokens = 0
        self.spec_accepted_per_pos = [0] * self.num_spec_tokens

    def _record_spec(self, num_drafts: int, num_accepted: int) -> None:
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += num_drafts
        self.spec_num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.spec_accepted_per_pos[pos] += 1
        totals = self.spec_totals
        totals["num_drafts"] += 1
        totals["num_draft_tokens"] += num_drafts
        totals["num_accepted_tokens"] += num_accepted

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
        if self.proposer is not None:
            stats.spec_decoding = SpecDecodingStats(
                num_spec_tokens=self.num_spec_tokens, num_drafts=self.spec_num_drafts,
                num_draft_tokens=self.spec_num_draft_tokens, num_accepted_tokens=self.spec_num_accepted_tokens,
                num_accepted_tokens_per_pos=self.spec_accepted_per_pos)
            self._reset_spec_stats()
        self.num_preemptions = 0
        return stats
