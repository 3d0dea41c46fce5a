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


def sliding_window(hf_config) -> int | None:
    """The attention window a config asks for (``sliding_window``, unless ``use_sliding_window`` is false, as
    Qwen2's and Qwen3's configs say, or the window is 0, Qwen2-MoE's default), or None for full attention."""
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return int(window)


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
        """Fill in what depends on the model's config.json: max_model_len and the step token budget; check the
        parallel layout against it (``check_parallel_model``).

        A sliding window (``sliding_window``) does not limit max_model_len: the model's attention layers apply it
        (``Attention(sliding_window=...)``), so a sequence longer than the window is served as the model means.

        Raises ConfigError when --max-model-len exceeds the model's max_position_embeddings, or the layout does not
        fit the model.
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
        self.check_parallel_model(hf_config)

    def check_supported(self) -> None:
        """Refuse, in one line, settings that parse (they are vLLM's flags) but that this build cannot run yet,
        so they fail before anything loads instead of later or, worse, silently.

        The KV connector of ``--kv-transfer-config`` is checked by ``brigade.kv_transfer.check_kv_transfer_config``
        (it needs the plugin registry, a layer above this one); what depends on the model (heads, layers, a
        quantized checkpoint) by ``check_parallel_model``, once config.json is read.

        Raises:
            ConfigError: data parallelism with a KV connector; the uni executor with several workers; tensor
                parallelism with a KV connector; pipeline parallelism with a KV connector. (LoRA, quantized
                checkpoints, ``--quantization``, speculative decoding and structured output run under both; a
                quantized layer that cannot be split is refused by its method when the model is built:
                docs/distributed.md, "Features under parallelism".)
        """
        parallel = self.parallel_config
        tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
        if parallel.data_parallel_size != 1 and self.kv_transfer_config is not None:
            raise ConfigError(f"--kv-transfer-config ({self.kv_transfer_config.kv_connector}) with -dp "
                              f"{parallel.data_parallel_size} is not supported: each engine would run its own "
                              "connector on the same store and side channel; run one server per engine instead")
        if parallel.world_size > 1 and parallel.distributed_executor_backend == "uni":
            raise ConfigError(f"--distributed-executor-backend uni runs one worker, but -tp {tp} -pp {pp} needs "
                              f"{parallel.world_size}; use --distributed-executor-backend mp or ray")
        if tp > 1 and self.kv_transfer_config is not None:
            raise ConfigError(f"--kv-transfer-config (a KV connector) with tensor parallelism (-tp {tp}) is not "
                              "supported yet; run one of them without the other")
        if pp > 1:
            if self.kv_transfer_config is not None:
                raise ConfigError(f"--kv-transfer-config (a KV connector) with pipeline parallelism (-pp {pp}) is "
                                  "not supported yet; run one of them without the other")

    def check_parallel_model(self, hf_config) -> None:
        """Refuse a parallel layout the model cannot take, in one line, from config.json alone.

        Raises:
            ConfigError: ``-tp`` does not divide the attention heads (or the MLP width), the KV heads can be
                neither split nor replicated evenly, or ``-pp`` is above the layer count. (A quantized layer
                whose packed words or groups the split would cut is refused by its quantization method, when
                the model is built: ``loader.check_quantized_layers`` builds it on ``meta`` first.)
        """
        tp, pp = self.parallel_config.tensor_parallel_size, self.parallel_config.pipeline_parallel_size
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        layers = hf_config.num_hidden_layers
        if pp > layers:
            raise ConfigError(f"-pp {pp} is above the model's {layers} layers; use -pp {layers} or less")
        if tp == 1:
            return
        if heads % tp:
            good = [d for d in range(1, heads + 1) if heads % d == 0]
            raise ConfigError(f"-tp {tp} does not divide the model's {heads} attention heads; use one of "
                              f"{', '.join(map(str, good))}")
        if (tp <= kv_heads and kv_heads % tp) or (tp > kv_heads and tp % kv_heads):
            raise ConfigError(f"-tp {tp} can neither split nor replicate the model's {kv_heads} KV heads evenly; use "
                              f"a divisor or a multiple of {kv_heads} that divides the {heads} attention heads")
        width = getattr(hf_config, "intermediate_size", None)
        if width is not None and width % tp:
            raise ConfigError(f"-tp {tp} does not divide the model's MLP width (intermediate_size {width})")
