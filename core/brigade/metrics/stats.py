"""Front-end statistics of one engine step, and the base class of stat loggers."""

from __future__ import annotations

from dataclasses import dataclass, field

from brigade.engine.messages import SchedulerStats


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
