"""JsonlStatLogger: appends one JSON object per engine step to the file named by BRIGADE_STATS_JSONL."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

import msgspec

from brigade.interfaces import IterationStats, SchedulerStats, StatLoggerBase
from brigade_jsonl_stat_logger import envs

logger = logging.getLogger(__name__)

PATH_ENV = "BRIGADE_STATS_JSONL"


class JsonlStatLogger(StatLoggerBase):
    """One line per step: ``{"step", "time", "scheduler_stats", "iteration_stats"}``.

    ``time`` is Unix seconds; ``scheduler_stats`` is null when the engine sent none. The file is opened in
    append mode and each line is flushed, so ``tail -f`` works and a crash loses at most one line.
    """

    def __init__(self, config: Any = None, *, path: str | None = None):
        self.path = path if path is not None else envs.BRIGADE_STATS_JSONL
        self.num_steps = 0
        self._file = None
        if not self.path:
            logger.debug("jsonl stat logger: %s is unset; it writes nothing", PATH_ENV)
            return
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in shutdown()

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats) -> None:
        if self._file is None:
            return
        line = {"step": self.num_steps, "time": time.time(),
                "scheduler_stats": msgspec.structs.asdict(scheduler_stats) if scheduler_stats is not None else None,
                "iteration_stats": dataclasses.asdict(iteration_stats)}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        self.num_steps += 1

    def shutdown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
