"""The CPU platform: the core's fallback, registered through the same hook as plugin platforms."""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from brigade.config import BrigadeConfig, ConfigError
from brigade.platforms.interface import Platform


CPU_MAX_NUM_BATCHED_TOKENS = 1024  # default --max-num-batched-tokens on the CPU, with chunked prefill


class CpuPlatform(Platform):
    """Runs the engine in fp32 (or bf16) on the host with the ``cpu`` attention backend (the reference
    backend with a compiled decode kernel; ``--attention-backend reference`` selects the pure-PyTorch one)."""

    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    default_attention_backend: ClassVar[str] = "cpu"
    default_dtype: ClassVar[torch.dtype] = torch.float32
    engine_start_method: ClassVar[str] = "fork"  # no device runtime to protect: reuse the front end's imports

    @classmethod
    def check_and_update_config(cls, config: BrigadeConfig) -> None:
        """The base choices, a smaller default step budget (``CPU_MAX_NUM_BATCHED_TOKENS``), then refuse a
        --kv-cache-memory larger than the machine's RAM, once per data-parallel engine (before any load).

        Raises ConfigError (one line) naming the machine's total memory.
        """
        super().check_and_update_config(config)
        sc = config.scheduler_config
        if sc.max_num_batched_tokens is None and sc.enable_chunked_prefill:
            # A CPU step is slow: with the 8192-token default one long prompt is a single ~10 s step on 2 cores
            # (SmolLM2, 4000 tokens) during which no other request gets a token. 1024-token chunks cut that
            # stall about 4x for a 6-17% longer TTFT of the long prompt itself (docs/benchmarks.md, "The default
            # step budget").
            sc.max_num_batched_tokens = CPU_MAX_NUM_BATCHED_TOKENS
        requested = config.cache_config.kv_cache_memory_gib
        total = _physical_memory_gib()
        parallel = config.parallel_config
        # Every data-parallel engine has its own pool (one engine process holds only its own).
        engines = parallel.data_parallel_size if parallel.data_parallel_rank is None else 1
        if requested is not None and total is not None and requested * engines > total:
            pools = f" x {engines} engines (-dp)" if engines > 1 else ""
            raise ConfigError(f"--kv-cache-memory {requested:g} GiB{pools} is more than this machine's {total:.1f} GiB "
                              f"of memory; the KV cache lives in RAM on the CPU, so give well under "
                              f"{total / engines:.0f}")


def _physical_memory_gib() -> float | None:
    """Total physical memory in GiB, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def detect_cpu() -> type[Platform]:
    """The CPU is always there."""
    return CpuPlatform
