"""Statistics of one engine step: the engine core's (``SchedulerStats``, sent inside ``EngineCoreOutputs``), the
front end's (``IterationStats``), and ``StatLoggerBase``, the interface of the loggers that receive both.

``StatLoggerBase`` lives here rather than in ``brigade.metrics`` because it is a contract between layers: the
front end's output loop calls it, and loggers implement it (``brigade.metrics``' own, and those plugins register
with ``register_stat_loggers``). A logger then needs only this package, never the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec


class SpecDecodingStats(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Speculative decoding counters of one step (vLLM's ``SpecDecodingStats``).

    A "draft" is one request's drafts verified in one step; per_pos[i] counts drafts whose token i was accepted.
    """

    num_spec_tokens: int = 0  # k, the most drafts per request per step
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = []  # [k]


class SchedulerStats(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Engine-side gauges and counters for one step of one engine, for /metrics and stat loggers. With data
    parallelism each engine sends its own (``engine_index``); the gauges are that engine's, not totals."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks in use, in [0, 1]
    prefix_cache_queries: int = 0  # tokens looked up this step
    prefix_cache_hits: int = 0  # tokens found this step
    num_preemptions: int = 0  # preemptions this step
    num_scheduled_tokens: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    # With LoRA: adapter name -> its requests running / waiting (vLLM's lora_requests_info labels).
    running_lora_adapters: dict[str, int] = {}
    waiting_lora_adapters: dict[str, int] = {}
    spec_decoding: SpecDecodingStats | None = None  # with --speculative-config
    # MoE models: decoder layer index -> tokens routed to each expert since the last report (ModelRunnerOutput's)
    expert_tokens: dict[int, list[int]] | None = None
    engine_index: int = 0  # the data-parallel engine these are from (0 .. dp - 1); /metrics' ``engine`` label


@dataclass(slots=True)
class FinishedRequestStats:
    """Timings of one finished request, in seconds."""

    finish_reason: str  # "stop", "length", "abort" or "error"
    e2e_latency_s: float  # arrival to last token
    num_prompt_tokens: int
    num_generation_tokens: int
    time_to_first_token_s: float | None  # None when no token came out
    tpot_s: float | None  # mean time per output token after the first; None below two tokens
    num_cached_tokens: int = 0


@dataclass(slots=True)
class IterationStats:
    """What the front end saw in one step's outputs."""

    num_prompt_tokens: int = 0  # prompt tokens of requests that got their first token this step
    num_generation_tokens: int = 0  # tokens generated this step
    time_to_first_tokens_s: list[float] = field(default_factory=list)
    inter_token_latencies_s: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


class StatLoggerBase:
    """Receives every step's statistics in the front-end process; subclasses publish them.

    Called on the front end's output loop, so implementations must be quick and must not block.
    """

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats) -> None:
        """Take one step's statistics. ``scheduler_stats`` is None when the engine sent none."""

    def log(self) -> None:
        """Called periodically by the server (every ``BRIGADE_LOG_STATS_INTERVAL`` s, default 10; never with
        ``--disable-log-stats``) for loggers that print summaries."""

    def shutdown(self) -> None:
        """Release files or sockets."""
