"""What the scheduler tests of this folder share: a scheduler on a small block pool, requests, and drivers that run
steps, each scheduled request sampling token 7 when its step reaches its last token. No model and no tensors: the
scheduler never touches them."""

from __future__ import annotations

import time

from brigade.config import CacheConfig, SchedulerConfig
from brigade.core.request import Request
from brigade.core.scheduler import Scheduler
from brigade.interfaces import ModelRunnerOutput, SchedulerOutput
from brigade.sampling_params import SamplingParams

EOS = 0
TOKEN = 7  # what every step samples: never EOS


def make_scheduler(*, policy: str = "fcfs", num_blocks: int = 64, block_size: int = 4, budget: int = 32,
                   max_seqs: int = 8, caching: bool = True, max_model_len: int = 256) -> Scheduler:
    """A scheduler over ``num_blocks`` blocks of ``block_size`` tokens (block 0 is the pool's null block)."""
    return Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, policy=policy),
                     CacheConfig(block_size=block_size, enable_prefix_caching=caching),
                     max_model_len=max_model_len, num_blocks=num_blocks)


def make_request(rid: str, prompt, max_tokens: int = 4, priority: int = 0, **sampling) -> Request:
    """A greedy request for ``prompt`` (token ids) of at most ``max_tokens``; ``sampling`` goes to SamplingParams."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **sampling)
    return Request(rid, list(prompt), params, EOS, time.time(), priority=priority, max_tokens=max_tokens)


def run_step(sched: Scheduler, token: int = TOKEN):
    """Schedule one step and feed back ``token`` for each request the step brings to its end: (plan, outputs)."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [[token] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else []
               for r in ids]
    return out, sched.update_from_output(out, ModelRunnerOutput(ids, sampled))


def _launch(sched: Scheduler) -> tuple[SchedulerOutput, ModelRunnerOutput]:
    """Schedule a step whose tokens are not known yet (overlapped): a request samples when this step reaches its
    last token, which ``schedule()`` then counts as a placeholder."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [[TOKEN] if sched.requests[r].num_computed_tokens == sched.requests[r].num_tokens_with_placeholders - 1
               else [] for r in ids]
    return out, ModelRunnerOutput(ids, sampled)


def run_until_done(sched: Scheduler, arriving: list[Request], *, max_steps: int, overlapped: bool
                   ) -> tuple[dict[str, int], bool]:
    """Step until every request has finished, one of ``arriving`` joining per step; with ``overlapped``, step N+1
    is scheduled before step N's tokens reach the scheduler (asynchronous scheduling). Checks every step against
    the token budget. Returns (new tokens per finished request id, whether any step preempted)."""
    finished: dict[str, int] = {}
    preempted = False
    in_flight = None
    for _ in range(max_steps):
        if arriving:
            sched.add_request(arriving.pop(0))
        if overlapped:
            out, runner_output = _launch(sched)
            outputs = sched.update_from_output(*in_flight).outputs if in_flight is not None else []
            in_flight = (out, runner_output) if runner_output.req_ids else None
        else:
            out, step_outputs = run_step(sched)
            outputs = step_outputs.outputs
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values()) <= sched.max_num_batched_tokens
        preempted |= bool(out.preempted_req_ids)
        for o in outputs:
            finished[o.request_id] = finished.get(o.request_id, 0) + len(o.new_token_ids)
        if not sched.requests and in_flight is None and not arriving:
            break
    return finished, preempted
