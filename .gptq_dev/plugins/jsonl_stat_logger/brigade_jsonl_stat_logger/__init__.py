"""brigade-jsonl-stat-logger: writes every step's SchedulerStats and IterationStats as one JSON line."""
