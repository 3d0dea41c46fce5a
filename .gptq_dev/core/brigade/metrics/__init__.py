"""Metrics: per-step statistics and the stat loggers that publish them (Prometheus, plugins)."""

from brigade.metrics.stats import FinishedRequestStats, IterationStats, StatLoggerBase

__all__ = ["FinishedRequestStats", "IterationStats", "StatLoggerBase"]
