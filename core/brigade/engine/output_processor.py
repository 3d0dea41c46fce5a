"""OutputProcessor: turns each step's EngineCoreOutputs into RequestOutputs for users.

Per sequence it detokenizes, applies stop strings (asking the engine to abort the sequence when one
matches), converts logprobs, and records timing. Per request it joins the n sequences back together
according to the request's output kind. An exception while doing so for one sequence (its tokenizer's decoder
raising, say) fails that request only, as the engine fails a request whose logits processor raised: every one of
its sequences finishes with finish_reason "error" and the message as stop_reason, the engine is asked to abort
them, and the other requests go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from brigade.engine.detokenizer import IncrementalDetokenizer
from brigade.interfaces import (CompletionOutput, EngineCoreOutput, FinishedRequestStats, FinishReason, IterationStats,
                                Logprob, LogprobsLists, RequestOutput, SampleLogprobs)
from brigade.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class SequenceState:
    """One of a request's n sequences, as the front end tracks it."""

    index: int
    parent: "ParentState"
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    new_token_ids: list[int] = field(default_factory=list)  # since the last emitted delta
    new_logprobs: SampleLogprobs = field(default_factory=list)
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_cached_tokens: int = 0


@dataclass
class ParentState:
    """A user request: its prompt, its sequences, and where its outputs go."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    sink: Callable[[RequestOutput], None]
    sequences: list[SequenceState] = field(default_factory=list)
    engine_ids: list[str] = field(default_factory=list)  # the engine request id of each sequence, in order
    # With prompt_logprobs: None for the first prompt token, then one entry per scored prompt token.
    prompt_logprobs: SampleLogprobs | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)


@dataclass
class ProcessedOutputs:
    """The front end's result for one step."""

    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]  # engine ids of sequences finished here by a stop string
    iteration_stats: IterationStats


class OutputProcessor:
    """Tracks every in-flight request of one front end."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.sequences: dict[str, SequenceState] = {}  # engine request id -> sequence
        self.parents: dict[str, ParentState] = {}
        self._aborted_stats = IterationStats()  # aborts since the last step, reported with its stats

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, engine_ids: list[str], arrival_time: float,
                    sink: Callable[[RequestOutput], None]) -> None:
        """Register a request and its engine-side sequence ids; ``sink`` receives its RequestOutputs."""
        parent = ParentState(request_id, prompt, prompt_token_ids, params, arrival_time, sink)
        if params.prompt_logprobs is not None:
            parent.prompt_logprobs = [None]
        for index, engine_id in enumerate(engine_ids):
            seq = SequenceState(index, parent, IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params))
            if params.logprobs is not None:
                seq.logprobs, seq.cumulative_logprob = [], 0.0
            parent.sequences.append(seq)
            parent.engine_ids.append(engine_id)
            self.sequences[engine_id] = seq
        self.parents[request_id] = parent

    def engine_ids(self, request_id: str) -> list[str]:
        """The engine ids of a request's sequences still tracked (O(n), not a scan of every live sequence)."""
        parent = self.parents.get(request_id)
        return [] if parent is None else [eid for eid in parent.engine_ids if eid in self.sequences]

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    def abort_request(self, request_id: str, *, notify: bool = False) -> list[str]:
        """Forget a request; returns the engine ids to abort. Its unfinished sequences count as aborted
        in the next step's statistics.

        Args:
            notify: also send the request's sink its final output: ``finished`` True, each sequence that
                was still running with ``finish_reason`` "abort" (with DELTA, one output per such
                sequence, holding the text held back for stop strings; otherwise one output with all of
                them). Nothing is sent for a request that is unknown or already finished.
        """
        ids = self.engine_ids(request_id)  # costs the request's own sequences: aborting N requests is O(N)
        now = time.time()
        aborted: list[SequenceState] = []
        for eid in ids:
            seq = self.sequences.pop(eid)
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
                self._record_finished(seq, now, self._aborted_stats)
                aborted.append(seq)
        parent = self.parents.pop(request_id, None)
        if notify and parent is not None and aborted:
            if parent.params.output_kind == RequestOutputKind.DELTA:
                for seq in aborted:
                    parent.sink(self._make_output(parent, seq))
            else:
                parent.sink(self._make_output(parent, None))
        return ids

    def fail_all(self, message: str) -> list[str]:
        """Finish every request with an error (engine death); returns the request ids."""
        ids = list(self.parents)
        for parent in self.parents.values():
            for seq in parent.sequences:
                if seq.finish_reason is None:
                    seq.finish_reason = str(FinishReason.ERROR)
                    seq.stop_reason = message
            parent.sink(self._make_output(parent, None))
        self.parents.clear()
        self.sequences.clear()
        return ids

    def process_outputs(self, outputs: list[EngineCoreOutput], timestamp: float | None = None) -> ProcessedOutputs:
        """Apply one step's engine outputs. Stop strings end sequences here; their ids come back to abort, with
        those of a request that failed here (``_fail_request``)."""
        now = time.time() if timestamp is None else timestamp
        stats, self._aborted_stats = self._aborted_stats, IterationStats()
        touched: dict[str, tuple[ParentState, SequenceState]] = {}
        to_abort: list[str] = []
        failed: set[str] = set()  # requests failed here: their error output is sent
        for out in outputs:
            seq = self.sequences.get(out.request_id)
            if seq is None:
                continue  # aborted by the front end (or failed here) meanwhile
            try:
                self._update_sequence(seq, out, now, stats)
            except Exception as exc:  # this request's bug (its tokenizer's decoder, say); the others go on
                to_abort.extend(self._fail_request(seq.parent, exc, now, stats))
                failed.add(seq.parent.request_id)
                continue
            if out.finish_reason is None and seq.finish_reason is not None:
                to_abort.append(out.request_id)  # a stop string ended it here
            if seq.finish_reason is not None:
                del self.sequences[out.request_id]
                self._record_finished(seq, now, stats)
            touched[seq.parent.request_id + f"/{seq.index}"] = (seq.parent, seq)
        request_outputs = []
        for parent, seq in touched.values():
            if parent.request_id in failed:
                continue  # failed later in this step: its error output was sent
            output = self._maybe_output(parent, seq)
            if output is not None:
                parent.sink(output)
                request_outputs.append(output)
            if parent.finished:
                self.parents.pop(parent.request_id, None)
        return ProcessedOutputs(request_outputs, to_abort, stats)

    def _fail_request(self, parent: ParentState, exc: Exception, now: float, stats: IterationStats) -> list[str]:
        """Finish every unfinished sequence of ``parent`` with finish_reason "error" (the message, naming ``exc``,
        as stop_reason), send its sink the final output and forget it. The caller's generate() raises
        EngineRequestError with the message, as for a logits processor that failed in the engine.

        Returns:
            the engine ids of its sequences, to abort (an id the engine already finished is ignored there).
        """
        message = (f"request {parent.request_id} failed while its output was detokenized or checked for stop "
                   f"strings: {type(exc).__name__}: {exc}")
        logger.error("%s; the other requests go on", message, exc_info=exc)
        for seq in parent.sequences:
            if seq.finish_reason is None:
                seq.finish_reason, seq.stop_reason = str(FinishReason.ERROR), message
                self._record_finished(seq, now, stats)
        engine_ids = self.engine_ids(parent.request_id)
        for engine_id in engine_ids:
            del self.sequences[engine_id]
        self.parents.pop(parent.request_id, None)
        parent.sink(self._make_output(parent, None))
        return engine_ids

    def _update_sequence(self, seq: SequenceState, out: EngineCoreOutput, now: float, stats: IterationStats) -> None:
        if out.new_token_ids:
            if seq.first_token_time is None:
                seq.first_token_time = now
                seq.num_cached_tokens = out.num_cached_tokens
                stats.num_prompt_tokens += len(seq.parent.prompt_token_ids)
                stats.time_to_first_tokens_s.append(now - seq.parent.arrival_time)
            else:
                stats.inter_token_latencies_s.append(now - seq.last_token_time)
            seq.last_token_time = now
            stats.num_generation_tokens += len(out.new_token_ids)
        if out.prompt_logprobs is not None and seq.index == 0 and seq.parent.prompt_logprobs is not None:
            # Every sequence of the request scores the same prompt; the first one's rows are kept.
            seq.parent.prompt_logprobs.extend(self._convert_logprobs(out.prompt_logprobs))
        seq.token_ids.extend(out.new_token_ids)
        seq.new_token_ids.extend(out.new_token_ids)
        if out.new_logprobs is not None and seq.logprobs is not None:
            entries = self._convert_logprobs(out.new_logprobs)
            seq.logprobs.extend(entries)
            seq.new_logprobs.extend(entries)
            seq.cumulative_logprob += sum(row[0] for row in out.new_logprobs.logprobs)
        stopped_by_token = out.finish_reason == FinishReason.STOP
        stop_str = seq.detokenizer.update(out.new_token_ids, skip_last=stopped_by_token)
        if stop_str is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop_str
            self._drop_tokens_after_stop(seq, out)
        elif out.finish_reason is not None:
            seq.finish_reason, seq.stop_reason = str(out.finish_reason), out.stop_reason

    @staticmethod
    def _drop_tokens_after_stop(seq: SequenceState, out: EngineCoreOutput) -> None:
        """Several tokens came in one step (speculative decoding) and a stop string ended before the last: drop
        the tokens after it, so token ids and logprobs end where they would with one token per step."""
        extra = seq.detokenizer.num_tokens_after_stop
        if not extra:
            return
        del seq.token_ids[-extra:], seq.new_token_ids[-extra:]
        if out.new_logprobs is not None and seq.logprobs is not None:
            del seq.logprobs[-extra:], seq.new_logprobs[-extra:]
            seq.cumulative_logprob -= sum(row[0] for row in out.new_logprobs.logprobs[-extra:])

    def _decode(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])

    def _convert_logprobs(self, lists: LogprobsLists) -> SampleLogprobs:
        result: SampleLogprobs = []
        for ids, lps, rank in zip(lists.token_ids, lists.logprobs, lists.ranks):
            entry: dict[int, Logprob] = {}
            for j, (tid, lp) in enumerate(zip(ids[1:], lps[1:]), start=1):
                entry[tid] = Logprob(lp, j, self._decode(tid))
            entry[ids[0]] = Logprob(lps[0], rank, self._decode(ids[0]))
            # The chosen token first, then the top-k in rank order.
            result.append({ids[0]: entry.pop(ids[0]), **entry})
        return result

    def _record_finished(self, seq: SequenceState, now: float, stats: IterationStats) -> None:
        parent = seq.parent
        ttft = None if seq.first_token_time is None else seq.first_token_time - parent.arrival_time
        tpot = None
        if len(seq.token_ids) > 1 and seq.first_token_time is not None:
            tpot = (seq.last_token_time - seq.first_token_time) / (len(seq.token_ids) - 1)
        stats.finished_requests.append(FinishedRequestStats(
            finish_reason=seq.finish_reason, e2e_latency_s=now - parent.arrival_time,
            num_prompt_tokens=len(parent.prompt_token_ids), num_generation_tokens=len(seq.token_ids),
            time_to_first_token_s=ttft, tpot_s=tpot, num_cached_tokens=seq.num_cached_tokens))

    def _maybe_output(self, parent: ParentState, seq: SequenceState) -> RequestOutput | None:
        kind = parent.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not parent.finished:
            return None
        if kind == RequestOutputKind.DELTA:
            return self._make_output(parent, seq)
        return self._make_output(parent, None)

    def _make_output(self, parent: ParentState, only: SequenceState | None) -> RequestOutput:
        delta = parent.params.output_kind == RequestOutputKind.DELTA
        completions = []
        for seq in ([only] if only is not None else parent.sequences):
            finished = seq.finish_reason is not None
            text = seq.detokenizer.get_text(finished, delta)
            completions.append(CompletionOutput(
                index=seq.index, text=text,
                token_ids=list(seq.new_token_ids) if delta else list(seq.token_ids),
                cumulative_logprob=seq.cumulative_logprob,
                logprobs=list(seq.new_logprobs) if (delta and seq.logprobs is not None) else seq.logprobs,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
            seq.new_token_ids.clear()
            seq.new_logprobs.clear()
        num_cached = max((s.num_cached_tokens for s in parent.sequences), default=0)
        return RequestOutput(request_id=parent.request_id, prompt=parent.prompt,
                             prompt_token_ids=parent.prompt_token_ids, outputs=completions,
                             finished=parent.finished, num_cached_tokens=num_cached,
                             prompt_logprobs=parent.prompt_logprobs)
