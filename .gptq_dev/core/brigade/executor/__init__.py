"""Executors: how the EngineCore reaches its workers (in process, or one process per device)."""
