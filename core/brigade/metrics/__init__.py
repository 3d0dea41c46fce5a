"""Metrics: the stat loggers that publish each step's statistics (Prometheus, the periodic log line).

The statistics themselves and ``StatLoggerBase`` are in ``brigade.interfaces``.
"""
