"""Scheduler: continuous batching at the level of single steps, as in vLLM v1.

Each step it gives every running request, then waiting ones, a number of new tokens within the token budget
(``max_num_batched_tokens``) and ``max_num_seqs``. Prefill chunks and decodes mix freely: a request needing one
token is decoding, one needing more is (still) prefilling. When KV blocks run out, a running request is
preempted (the scheduling policy picks it: the last admitted under fcfs, the lowest priority under priority):
its blocks are freed and it is recomputed later. The scheduler decides *what* runs; it never touches tensors.

Features that change which requests run, or with how many tokens, are policy objects that return decisions;
the scheduler owns the queues and the KV cache manager and applies them:
``LoRAAdmission`` (``--max-loras``), ``SpecDrafts`` (speculative decoding), ``ExternalKV`` (a KV connector's
tokens) and ``GrammarGate`` (structured output). A request the runner could not run (its LoRA adapter's evicted
weights cannot be read again) comes back in ``ModelRunnerOutput.failures`` as not run and is finished as aborted;
one that ran but failed in the step is finished with finish_reason "error".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from brigade.config import CacheConfig, LoRAConfig, SchedulerConfig, SpeculativeConfig
from brigade.core.external_kv import ExternalKV
from brigade.core.grammar_gate import VIOLATION_REASON, GrammarGate, GrammarVerdict
from brigade.core.kv_cache_manager import KVCacheManager
from brigade.core.lora_admission import LoRAAdmission
from brigade.core.prompt_logprobs import PromptLogprobsLedger, scheduled_num_computed
from brigade.core.request import Request, RequestStatus
from brigade.core.request_queue import make_request_queue
from brigade.core.spec_drafts import SpecDrafts
from brigade.core.step_plan import StepPlan
from brigade.core.stop_conditions import append_until_stop
from brigade.interfaces import (EngineCoreOutput, EngineCoreOutputs, FinishReason, LogprobsLists, ModelRunnerOutput,
                                NewRequestData, RequestFailure, SchedulerOutput, SchedulerStats)
from brigade.interfaces.kv_cache_spec import KVCacheSpec
from brigade.kv_transfer.base import KVConnectorBase

logger = logging.getLogger("brigade.engine")


class Scheduler:
    """Owns every unfinished request and the KV cache manager.

    Invariant: ``requests`` holds exactly the requests in ``waiting`` or ``running``; running requests are
    the ones holding KV blocks.
    """

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, *, max_model_len: int,
                 num_blocks: int, structured_output_manager=None, lora_config: LoRAConfig | None = None,
                 speculative_config: SpeculativeConfig | None = None, kv_connector: KVConnectorBase | None = None,
                 pipeline: bool = False, kv_cache_specs: Sequence[KVCacheSpec] | None = None):
        self.config = scheduler_config
        # Pipeline parallelism: several steps in flight, a request in at most one of them once it samples (its
        # next input is its sample), and its sampled tokens sent to the workers (CachedRequestData.new_token_ids).
        self.pipeline = pipeline
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = scheduler_config.max_num_batched_tokens or 8192
        assert cache_config.block_size is not None, "the platform must set the block size"
        # One spec per KV cache group (KVCacheConfig.groups' order); None: one full-attention group.
        self.kv_cache_manager = KVCacheManager(num_blocks, cache_config.block_size,
                                               cache_config.enable_prefix_caching,
                                               cache_config.prefix_caching_hash_algo, kv_cache_specs)
        self.requests: dict[str, Request] = {}
        self.waiting = make_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # told to the runner on the next schedule()
        self.num_preemptions = 0  # since the last make_stats()
        self.num_preemptions_total = 0  # since start
        self.grammar_failures: list[EngineCoreOutput] = []  # reported by the next update_from_output
        self.prompt_logprobs = PromptLogprobsLedger()
        self.lora_admission = LoRAAdmission(lora_config.max_loras if lora_config is not None else None)
        self.spec_drafts = SpecDrafts(speculative_config, max_model_len)
        self.external_kv = ExternalKV(kv_connector)
        self.grammar_gate = GrammarGate(structured_output_manager)

    @property
    def kv_connector(self) -> KVConnectorBase | None:
        """The scheduler-role KV connector, or None."""
        return self.external_kv.connector

    @kv_connector.setter
    def kv_connector(self, connector: KVConnectorBase | None) -> None:
        self.external_kv.connector = connector

    @property
    def num_external_tokens_total(self) -> int:
        """Tokens a KV connector provided instead of computing them, since start."""
        return self.external_kv.num_external_tokens_total

    @property
    def spec_totals(self) -> dict[str, int]:
        """Since start (tests, bench): drafts (steps of a request with drafts), draft tokens, accepted tokens."""
        return self.spec_drafts.totals

    # ---- requests in and out --------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.add(request)
        self.grammar_gate.add_request(request.request_id, request.sampling_params.structured_outputs)

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
        self.external_kv.check_finished(request, self.kv_cache_manager.get_block_ids(request.request_id)[0])
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        self.grammar_gate.remove_request(request.request_id)
        self.prompt_logprobs.forget(request.request_id)
        del self.requests[request.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def lora_ids_in_use(self) -> set[int]:
        """The ``lora_int_id`` of every adapter an unfinished request (running, waiting or preempted) runs on:
        the adapters whose weights the workers must keep."""
        return LoRAAdmission.ids_in_use(self.requests.values())

    # ---- one step -------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan one step: running requests first, then waiting ones, preempting on block shortage."""
        step = StepPlan(budget=self.max_num_batched_tokens)
        index = 0
        while index < len(self.running) and step.budget > 0:
            request = self.running[index]
            num_new = self._num_new_tokens(request, step.budget)
            if num_new == 0:
                index += 1
                continue
            drafts, new_blocks = self._allocate_with_drafts(request, num_new, step.budget)
            if new_blocks is None:
                new_blocks, index = self._allocate_or_preempt(request, num_new, step, index)
            if new_blocks is None:
                break  # the request itself was preempted
            step.add_running(request, num_new + len(drafts), new_blocks, drafts)
            if self.pipeline:
                step.cached.new_token_ids.append(
                    request.all_token_ids[max(request.num_computed_tokens, request.num_prompt_tokens):])
            request.spec_token_ids = []  # consumed; update_from_output proposes the next ones
            index += 1

        # Admit waiting requests only when nothing was preempted: memory is short otherwise.
        set_aside: list[Request] = []  # grammar still compiling, or a LoRA without a slot: requeued in order
        self.lora_admission.start_step(self.running)
        while not step.preempted_req_ids and len(self.waiting) and step.budget > 0 \
                and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            if self._sits_out(request):
                set_aside.append(self.waiting.pop())
                continue
            if request.num_output_placeholders:
                break  # preempted with a token still in flight: resume once it is known
            if not self._admit(request, step):
                break  # its prompt does not fit the budget unchunked, or blocks are short
        for request in reversed(set_aside):
            if not request.is_finished():
                self.waiting.prepend(request)
        return self._make_output(step)

    def _token_limit(self, budget: int) -> int:
        """The most tokens one request may be scheduled this step: the budget left, and the long-prefill
        threshold when other requests are unfinished."""
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0 and len(self.running) + len(self.waiting) > 1:
            return min(threshold, budget)
        return budget

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        if request.num_output_tokens + request.num_output_placeholders >= request.max_tokens:
            return 0  # its last token is still in flight
        if request.num_output_placeholders and (self.pipeline or request.needs_last_token):
            # Its token is still in flight, and its next input (the next stage waits on it under a pipeline)
            # or its grammar's next bitmask needs it: this step goes without it.
            return 0
        return min(request.num_tokens_with_placeholders - request.num_computed_tokens, self._token_limit(budget))

    def _allocate_with_drafts(self, request: Request, num_new: int, budget: int):
        """Slots for a decode and the drafts that fit, or ``([], None)``: no drafts, or short of blocks for
        them (drafts are optional work: the plain decode then goes through preemption as usual)."""
        if num_new != 1 or not request.spec_token_ids:
            return [], None
        drafts = self.spec_drafts.schedulable(request, self._token_limit(budget))
        if drafts:
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new + len(drafts))
            if new_blocks is not None:
                return drafts, new_blocks
        return [], None

    def _allocate_or_preempt(self, request: Request, num_new: int, step: StepPlan, index: int):
        """Allocate slots for ``running[index]``, preempting the policy's victims until it fits or ``request``
        itself goes. A victim scheduled earlier in this step is taken back out of ``step``.

        Returns:
            (the new blocks, or None when ``request`` was preempted; ``request``'s index in ``running`` now).
        """
        while True:
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new)
            if new_blocks is not None:
                return new_blocks, index
            position = self.waiting.victim_index(self.running)
            victim = self.running.pop(position)
            if position < index:  # scheduled (or passed over) earlier in this step
                index -= 1
                step.drop(victim.request_id)
            self._preempt(victim)
            step.preempted_req_ids.add(victim.request_id)
            if victim is request:
                return None, index

    def _admit(self, request: Request, step: StepPlan) -> bool:
        """Move the head of the waiting queue to running with its first chunk, if it fits: local prefix-cache
        hits first, then the KV connector's tokens, then what is left to compute."""
        hit_blocks, num_hit = self.kv_cache_manager.get_computed_blocks(request)
        if request.sampling_params.prompt_logprobs is not None:
            hit_blocks, num_hit = None, 0  # cached prompt tokens are never computed, so they get no logprobs
        num_external = self.external_kv.num_matched_tokens(request, num_hit)
        num_new = request.num_tokens - num_hit - num_external
        if not self.config.enable_chunked_prefill and num_new > step.budget:
            return False
        num_new = min(num_new, self._token_limit(step.budget))
        if self.kv_cache_manager.allocate_slots(request, num_new, hit_blocks, num_hit, num_external) is None:
            return False
        self.waiting.pop()
        self.running.append(request)
        self.lora_admission.admitted(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit
        block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
        self.external_kv.allocated(request, block_ids[0], num_external)  # connectors serve one group only
        request.num_computed_tokens = num_hit + num_external
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit + num_external
        step.add_new(NewRequestData(
            req_id=request.request_id, token_ids=list(request.all_token_ids),
            num_prompt_tokens=request.num_prompt_tokens, sampling_params=request.sampling_params,
            eos_token_id=request.eos_token_id, block_ids=block_ids,
            num_computed_tokens=num_hit + num_external, lora_int_id=request.lora_int_id), num_new)
        return True

    def _sits_out(self, request: Request) -> bool:
        """True when the head of the waiting queue is set aside for this step: its grammar is still compiling
        or failed (then it is finished here, reported by the next update_from_output), or its LoRA adapter
        has no slot under ``max_loras``."""
        if self.grammar_gate.is_compiling(request.request_id):
            return True
        error = self.grammar_gate.take_failure(request.request_id)
        if error is not None:
            request.status = RequestStatus.FINISHED_ABORTED
            self._free_request(request)
            self.grammar_failures.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                                          finish_reason=FinishReason.ABORT, stop_reason=error))
            return True
        return not self.lora_admission.may_admit(request)

    def _make_output(self, step: StepPlan) -> SchedulerOutput:
        """Close the step: bitmasks for the constrained requests that sample, every scheduled request's
        computed tokens moved forward (plus a placeholder for the token this step samples), the connector's
        metadata."""
        structured_ids = self.grammar_gate.bitmask_req_ids(
            (self.requests[req_id], num_new) for req_id, num_new in step.num_scheduled.items())
        for req_id, num_new in step.num_scheduled.items():
            request = self.requests[req_id]
            request.num_computed_tokens += num_new
            num_drafts = len(step.spec_tokens.get(req_id, ()))
            if request.num_computed_tokens - num_drafts == request.num_tokens_with_placeholders:
                request.num_output_placeholders += 1  # this step samples its next token
        output = SchedulerOutput(step.new_reqs, step.cached, step.num_scheduled, sum(step.num_scheduled.values()),
                                 self.finished_req_ids, step.preempted_req_ids,
                                 scheduled_spec_decode_tokens=step.spec_tokens)
        output.kv_connector_metadata = self.external_kv.metadata(output)
        if structured_ids:
            output.structured_output_req_ids = structured_ids
            output.grammar_bitmask = self.grammar_gate.bitmask(structured_ids)
        self.finished_req_ids = set()
        return output

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
                request.num_computed_tokens -= self.spec_drafts.num_rejected(len(drafts), len(token_ids))
            request.num_output_placeholders = max(0, request.num_output_placeholders - len(token_ids))
            was_running = request.status == RequestStatus.RUNNING
            token_ids = append_until_stop(request, token_ids, self.max_model_len)
            self._maybe_advance_grammar(request, token_ids)
            new_logprobs = runner_output.logprobs.get(req_id)
            if new_logprobs is not None and len(new_logprobs.ranks) > len(token_ids):  # cut at a stop
                n = len(token_ids)
                new_logprobs = LogprobsLists(new_logprobs.token_ids[:n], new_logprobs.logprobs[:n],
                                             new_logprobs.ranks[:n])
            if self.spec_drafts.enabled and was_running and not request.is_finished():
                request.spec_token_ids = self.spec_drafts.propose(request)
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=token_ids, new_logprobs=new_logprobs,
                prompt_logprobs=prompt_logprobs,
                finish_reason=request.get_finish_reason(), stop_reason=request.stop_reason,
                num_cached_tokens=max(request.num_cached_tokens, 0)))
            if request.is_finished():
                # A request preempted while its token was in flight finishes from the waiting queue.
                (self.running if was_running else self.waiting).remove(request)
                self._free_request(request)
        stats = self.make_stats(scheduler_output)
        stats.expert_tokens = runner_output.expert_tokens  # plain lists, counted by the runner
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=stats, timestamp=time.time())

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

    def _new_prompt_logprobs(self, request: Request | None, scheduler_output: SchedulerOutput,
                             runner_output: ModelRunnerOutput) -> LogprobsLists | None:
        """The runner's prompt logprobs for a request this step, minus rows its client already had."""
        lists = runner_output.prompt_logprobs.get(request.request_id) if request is not None else None
        if lists is None:
            return None
        # From the step's own plan, not the request's live count: under overlapped scheduling the next step was
        # scheduled (and the count advanced) before this one's output is read.
        first_token = scheduled_num_computed(scheduler_output, request.request_id) + 1  # the token of the first row
        return self.prompt_logprobs.take_new(request.request_id, first_token, lists)

    def _maybe_advance_grammar(self, request: Request, token_ids: list[int]) -> None:
        """Feed the step's tokens to the request's matcher; a completed grammar stops the request."""
        if not self.grammar_gate.enabled or request.is_finished():
            return
        verdict = self.grammar_gate.advance(request.request_id, token_ids)
        if verdict is GrammarVerdict.VIOLATED:
            request.status = RequestStatus.FINISHED_ABORTED  # another mask left no token the grammar allows
            request.stop_reason = VIOLATION_REASON
        elif verdict is GrammarVerdict.TERMINATED:
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
        if self.lora_admission.enabled:
            stats.running_lora_adapters = LoRAAdmission.adapter_counts(self.running)
            stats.waiting_lora_adapters = LoRAAdmission.adapter_counts(self.waiting)
        stats.spec_decoding = self.spec_drafts.take_stats()
        self.num_preemptions = 0
        return stats
