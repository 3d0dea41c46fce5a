"""LoggingStatLogger: vLLM's periodic stats line in the server's log (``--disable-log-stats`` turns it off).

Every ``log()`` call (the server's stat task, every ``BRIGADE_LOG_STATS_INTERVAL`` seconds, default 10, as vLLM's
``VLLM_LOG_STATS_INTERVAL``) writes one line with the throughput since the last call and the latest scheduler state:

    Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.1 tokens/s, Running: 3 reqs,
    Waiting: 0 reqs, KV cache usage: 4.2%, Prefix cache hit rate: 37.5%

With data parallelism the running and waiting counts are the engines' sums and the KV cache usage is over all
their blocks (each engine's latest report). At INFO while tokens flow (and once more after they stop), at DEBUG when idle, so an idle server's log stays quiet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from brigade.interfaces import IterationStats, SchedulerStats, StatLoggerBase

logger = logging.getLogger("brigade.metrics")


class LoggingStatLogger(StatLoggerBase):
    """Accumulates token counts between ``log()`` calls and logs them as rates.

    Args:
        clock: seconds (``time.monotonic`` by default); the rates divide by the time between calls.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._last_log = clock()
        self._scheduler: dict[int, SchedulerStats] = {}  # engine index -> its latest stats
        self._prompt_tokens = self._generation_tokens = 0
        self._prefix_queries = self._prefix_hits = 0
        self._was_active = False

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats) -> None:
        self._prompt_tokens += iteration_stats.num_prompt_tokens
        self._generation_tokens += iteration_stats.num_generation_tokens
        if scheduler_stats is not None:
            self._scheduler[scheduler_stats.engine_index] = scheduler_stats
            self._prefix_queries += scheduler_stats.prefix_cache_queries
            self._prefix_hits += scheduler_stats.prefix_cache_hits

    def log(self) -> None:
        now = self._clock()
        elapsed = max(now - self._last_log, 1e-9)
        prompt_rate, generation_rate = self._prompt_tokens / elapsed, self._generation_tokens / elapsed
        active = bool(self._prompt_tokens or self._generation_tokens)
        hit_rate = 100.0 * self._prefix_hits / self._prefix_queries if self._prefix_queries else 0.0
        stats = list(self._scheduler.values())
        running = sum(s.num_running_reqs for s in stats)
        waiting = sum(s.num_waiting_reqs for s in stats)
        logger.log(logging.INFO if active or self._was_active else logging.DEBUG,
                   "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
                   "Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%", prompt_rate,
                   generation_rate, running, waiting, 100.0 * _kv_cache_usage(stats), hit_rate)
        self._was_active = active
        self._last_log = now
        self._prompt_tokens = self._generation_tokens = 0
        self._prefix_queries = self._prefix_hits = 0


def _kv_cache_usage(stats: list[SchedulerStats]) -> float:
    """Fraction of all engines' KV blocks in use (the mean of their usages where block counts are missing)."""
    total = sum(s.num_total_blocks for s in stats)
    if total and all(s.num_total_blocks for s in stats):
        return (total - sum(s.num_free_blocks for s in stats)) / total
    return sum(s.kv_cache_usage for s in stats) / len(stats) if stats else 0.0
