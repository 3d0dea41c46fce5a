"""CacheConfig: the paged KV cache's block size, budget, dtype and prefix caching."""

from __future__ import annotations

from dataclasses import dataclass

from brigade.config.errors import ConfigError


FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3")
"""The --kv-cache-dtype names of the float8 e4m3 KV cache (vLLM's)."""
MIN_KV_BLOCKS = 2
"""The least KV pool that can hold a token: block 0 is the null block (``BlockPool``), padding that never holds any."""


@dataclass
class CacheConfig:
    """The paged KV cache: block size, memory budget and prefix caching."""

    block_size: int | None = None
    """Tokens per KV block; None lets the platform choose (16 on most)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of device memory Brigade may use for weights, activations and KV cache (GPU only)."""
    kv_cache_memory_gib: float | None = None
    """KV pool size in GiB; overrides profiling. On the CPU it defaults to 1 GiB."""
    num_gpu_blocks_override: int | None = None
    """Force this many KV blocks (tests use it to force preemption); at least 2, as block 0 is the null block."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks across requests sharing a prefix (chained block hashes)."""
    cache_dtype: str = "auto"
    """KV cache dtype: auto, or the model dtype's name (bfloat16, float16, float32), kept in the model dtype; or
    fp8 (alias fp8_e4m3, vLLM's names): float8 e4m3 with a per-layer k/v scale (``brigade.attention.fp8_kv``),
    1 byte per element. A dtype other than the model's is refused once that is resolved (``check_cache_dtype``);
    so is fp8_e5m2."""
    prefix_caching_hash_algo: str = "sha256"
    """sha256 (cryptographic, seed may be fixed) or builtin (Python hash with a random seed)."""

    def __post_init__(self) -> None:
        if self.block_size is not None and (self.block_size < 1 or self.block_size & (self.block_size - 1)):
            raise ConfigError(f"--block-size must be a power of two such as 16, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < MIN_KV_BLOCKS:
            raise ConfigError(f"--num-gpu-blocks-override must be at least {MIN_KV_BLOCKS}, got "
                              f"{self.num_gpu_blocks_override}: block 0 is the KV cache's null block (padding, it "
                              "never holds tokens), so N blocks hold N - 1 blocks of tokens")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ConfigError(f"--kv-cache-memory must be a positive number of GiB, got {self.kv_cache_memory_gib}")
        if self.cache_dtype == "fp8_e5m2":
            raise ConfigError("--kv-cache-dtype fp8_e5m2 is not supported: the fp8 KV cache is e4m3 with per-layer "
                              "scales; use --kv-cache-dtype fp8 (or fp8_e4m3), or auto")
        if self.cache_dtype not in ("auto", "bfloat16", "float16", "float32", *FP8_CACHE_DTYPES):
            raise ConfigError(f"--kv-cache-dtype {self.cache_dtype!r} is not known; use auto (the model dtype), the "
                              "model dtype's own name (whichever of bfloat16, float16, float32 it runs in), or fp8 "
                              "(alias fp8_e4m3)")

    @property
    def fp8_kv_cache(self) -> bool:
        """True when the KV cache is stored in float8 e4m3 (``--kv-cache-dtype fp8`` or ``fp8_e4m3``)."""
        return self.cache_dtype in FP8_CACHE_DTYPES

    def check_cache_dtype(self, model_dtype: str) -> None:
        """Refuse a --kv-cache-dtype naming a dtype other than the model's (``model_dtype``, e.g. "bfloat16"),
        once that is resolved; fp8 goes with any model dtype.

        Raises:
            ConfigError: one line naming both dtypes and the two ways out.
        """
        if self.cache_dtype not in ("auto", model_dtype, *FP8_CACHE_DTYPES):
            raise ConfigError(f"--kv-cache-dtype {self.cache_dtype} differs from the model dtype {model_dtype}; the KV "
                              f"cache is kept in the model dtype: use --kv-cache-dtype auto (or --dtype "
                              f"{self.cache_dtype})")
