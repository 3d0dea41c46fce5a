"""BrigadeConfig: the sub-configs of one engine composed, with what the model's config.json fills in and the
settings this build refuses."""

from __future__ import annotations

from dataclasses import dataclass, field

from brigade.config.cache import CacheConfig
from brigade.config.compilation import CompilationConfig
from brigade.config.errors import ConfigError
from brigade.config.kv_transfer import KVTransferConfig
from brigade.config.lora import LoRAConfig
from brigade.config.model import ModelConfig
from brigade.config.parallel import ParallelConfig
from brigade.config.scheduler import SchedulerConfig
from brigade.config.speculative import SpeculativeConfig


@dataclass
class BrigadeConfig:
    """Everything one engine needs. Each component receives only its own sub-config."""

    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    kv_transfer_config: KVTransferConfig | None = None
    lora_config: LoRAConfig | None = None
    """Set (even empty of adapters) when LoRA is enabled; None otherwise."""
    speculative_config: SpeculativeConfig | None = None
    """Set when speculative decoding is enabled (--speculative-config); None otherwise."""
    attention_backend: str | None = None
    """Name of a registered attention backend; None lets the platform choose."""
    device: str = "auto"
    """Platform device type, filled in from the active platform."""

    def resolve(self, hf_config) -> None:
        """Fill in what depends on the model's config.json: max_model_len and the step token budget.

        Raises ConfigError when --max-model-len exceeds the model's max_position_embeddings.
        """
        limit = getattr(hf_config, "max_position_embeddings", None)
        mc = self.model_config
        if mc.max_model_len is None:
            mc.max_model_len = limit or 2048
        elif limit is not None and mc.max_model_len > limit:
            raise ConfigError(f"--max-model-len {mc.max_model_len} exceeds the model's "
                              f"max_position_embeddings ({limit}); use at most {limit}")
        sc = self.scheduler_config
        if sc.max_num_batched_tokens is None:
            sc.max_num_batched_tokens = 8192 if sc.enable_chunked_prefill else max(8192, mc.max_model_len)
        if not sc.enable_chunked_prefill and sc.max_num_batched_tokens < mc.max_model_len:
            raise ConfigError(f"--max-num-batched-tokens {sc.max_num_batched_tokens} is below --max-model-len "
                              f"{mc.max_model_len}; without chunked prefill it must be at least that")

    def check_supported(self) -> None:
        """Refuse, in one line, settings that parse (they are vLLM's flags) but that this build cannot run yet,
        so they fail before anything loads instead of later or, worse, silently.

        The KV connector of ``--kv-transfer-config`` is checked by ``brigade.kv_transfer.check_kv_transfer_config``
        (it needs the plugin registry, a layer above this one).

        Raises:
            ConfigError: tensor or pipeline parallelism above 1; data parallelism with a KV connector; the ray executor.
        """
        parallel = self.parallel_config
        world = parallel.world_size
        if world != 1:
            raise ConfigError(f"tensor/pipeline parallelism of {world} is not implemented yet; run with -tp 1 -pp 1")
        if parallel.data_parallel_size != 1 and self.kv_transfer_config is not None:
            raise ConfigError(f"--kv-transfer-config ({self.kv_transfer_config.kv_connector}) with -dp "
                              f"{parallel.data_parallel_size} is not supported: each engine would run its own "
                              "connector on the same store and side channel; run one server per engine instead")
        if parallel.distributed_executor_backend not in (None, "uni", "mp"):
            raise ConfigError(f"--distributed-executor-backend {parallel.distributed_executor_backend} is not "
                              "available in this build; use uni or mp")
