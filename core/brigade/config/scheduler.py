"""SchedulerConfig: the step budget, the batch limit, chunked prefill, policy and overlap."""

from __future__ import annotations

from dataclasses import dataclass

from brigade.config.errors import ConfigError


@dataclass
class SchedulerConfig:
    """Continuous batching limits per step."""

    max_num_seqs: int = 256
    """Most requests running at once."""
    max_num_batched_tokens: int | None = None
    """Token budget per step; defaults to max(8192, max_model_len) when chunked prefill is on."""
    enable_chunked_prefill: bool = True
    """Split long prompts across steps and mix them with decodes."""
    long_prefill_token_threshold: int = 0
    """Cap on one prefill chunk's tokens per step; 0 disables it."""
    policy: str = "fcfs"
    """fcfs (arrival order; the last admitted running request is preempted first) or priority (lowest
    ``(priority, arrival_time)`` first; the running request with the largest priority value, then the latest
    arrival, is preempted first)."""
    async_scheduling: bool | None = None
    """Schedule and launch step N+1 before step N's tokens reach the host, hiding host work behind the
    device. None turns it on for GPUs. Penalties, bad words and min_tokens read the token still in flight on
    the device, so they keep it on; while a request with a grammar runs, steps run one at a time (its matcher
    needs the previous token on the host before the next bitmask)."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ConfigError(f"--max-num-batched-tokens must be at least 1, got {self.max_num_batched_tokens}")
        if self.policy not in ("fcfs", "priority"):
            raise ConfigError(f"--scheduling-policy {self.policy!r} is not known; use fcfs or priority")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError(f"--long-prefill-token-threshold must be 0 (off) or more, got "
                              f"{self.long_prefill_token_threshold}")
