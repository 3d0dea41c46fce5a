"""Worker: one device's process-side owner of a model runner.

It sets up the device, loads the model, sizes the KV pool from a memory budget, and runs steps.
"""

from __future__ import annotations

import logging

import torch

from brigade.config import BrigadeConfig, ConfigError
from brigade.interfaces import AsyncModelRunnerOutput, ModelRunnerOutput, SchedulerOutput
from brigade.interfaces.kv_cache_spec import KVCacheConfig, KVCacheGroup, KVCacheSpec
from brigade.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_GIB = 1 << 30
DEFAULT_CPU_KV_CACHE_GIB = 1.0


class Worker:
    """Runs on one device. ``local_rank`` picks the device; ``rank`` is its place in the world."""

    def __init__(self, config: BrigadeConfig, local_rank: int = 0, rank: int = 0):
        from brigade.plugins import current_platform, registries

        self.config = config
        self.local_rank = local_rank
        self.rank = rank
        self.platform = current_platform()
        self.device = self.platform.device_for_rank(local_rank)
        self.attn_backend = registries.attention_backends.get(config.attention_backend or
                                                              self.platform.default_attention_backend)
        self.model_runner: ModelRunner | None = None

    def init_device(self, hf_config) -> None:
        """Bind the device, seed the RNGs, validate the attention backend, and create the runner."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(self.config.model_config.seed)
        # "dtype" first: reading "torch_dtype" warns (deprecated) in transformers 5.
        config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(config_dtype, str):
            config_dtype = getattr(torch, config_dtype, None)
        dtype = self.platform.resolve_dtype(self.config.model_config.dtype, config_dtype)
        self.config.cache_config.check_cache_dtype(str(dtype).removeprefix("torch."))
        head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        reason = self.attn_backend.validate(head_size=head_size, dtype=dtype,
                                            block_size=self.config.cache_config.block_size,
                                            device_type=self.device.type)
        if reason is not None:
            raise ValueError(f"attention backend {self.attn_backend.name!r} cannot run this model: {reason}")
        if self.config.cache_config.fp8_kv_cache and not self.attn_backend.supports_fp8_kv_cache:
            raise ConfigError(f"--kv-cache-dtype {self.config.cache_config.cache_dtype}: attention backend "
                              f"{self.attn_backend.name!r} does not store an fp8 KV cache; use --kv-cache-dtype auto "
                              "or a backend that does (reference, cpu, triton)")
        self.model_runner = ModelRunner(self.config, self.device, dtype, self.attn_backend, hf_config)

    def load_model(self) -> None:
        self.model_runner.load_model()

    def kv_cache_specs(self) -> dict[int, KVCacheSpec]:
        """The KV cache spec of each attention layer this rank holds, from the loaded model."""
        return self.model_runner.kv_cache_specs()

    def determine_num_kv_blocks(self, groups: tuple[KVCacheGroup, ...]) -> int:
        """Size the KV pool for the model's KV cache ``groups`` (every rank's layers): --num-gpu-blocks-override,
        else --kv-cache-memory, else profile the device. A block id costs one page in each KV tensor this rank
        allocates (``KVCacheTensors.bytes_per_block``)."""
        cache = self.config.cache_config
        per_block = self.model_runner.kv_cache_bytes_per_block(groups)
        if self.rank == 0:
            self._log_cache_dtype(per_block, groups)
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override
        if cache.kv_cache_memory_gib is not None:
            return int(cache.kv_cache_memory_gib * _GIB // per_block)
        if self.device.type == "cpu":
            return int(DEFAULT_CPU_KV_CACHE_GIB * _GIB // per_block)
        return self._profile_num_blocks(per_block, groups)

    def _log_cache_dtype(self, per_block: int, groups: tuple[KVCacheGroup, ...]) -> None:
        """One INFO line: the KV cache's dtype and block size in bytes; for fp8, how many more blocks that holds
        than the model dtype (and bfloat16) in the same memory."""
        spec = self.model_runner.kv_cache
        name = str(spec.storage_dtype).removeprefix("torch.")
        if spec.cache_dtype is None:
            logger.info("KV cache dtype %s: %d bytes per block", name, per_block)
            return
        model = str(spec.dtype).removeprefix("torch.")
        ratios = [f"{spec.bytes_per_block(groups, spec.dtype) / per_block:.1f}x the blocks of {model}"]
        if spec.dtype != torch.bfloat16:
            ratios.append(f"{spec.bytes_per_block(groups, torch.bfloat16) / per_block:.1f}x of bfloat16")
        logger.info("KV cache dtype %s (--kv-cache-dtype %s): %d bytes per block, %s in the same memory", name,
                    self.config.cache_config.cache_dtype, per_block, ", ".join(ratios))

    def _profile_num_blocks(self, per_block: int, groups: tuple[KVCacheGroup, ...]) -> int:
        """Run the largest step once and give the KV pool what is left of the memory budget."""
        sched = self.config.scheduler_config
        num_tokens = sched.max_num_batched_tokens or 8192
        self.platform.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.model_runner.profile_run(num_tokens, sched.max_num_seqs, groups)
        self.platform.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device)
        free, total = self.platform.mem_get_info()
        # Memory outside PyTorch's allocator (other processes, NCCL, the CUDA context) still counts.
        non_torch = total - free - torch.cuda.memory_reserved(self.device)
        budget = total * self.config.cache_config.gpu_memory_utilization - peak - max(non_torch, 0)
        self.platform.empty_cache()
        num_blocks = int(budget // per_block)
        if num_blocks < 2:
            raise RuntimeError(f"no memory left for the KV cache: budget {budget / _GIB:.2f} GiB after "
                               f"weights and activations (peak {peak / _GIB:.2f} GiB); raise "
                               "--gpu-memory-utilization or lower --max-num-batched-tokens")
        logger.info("profiled peak %.2f GiB; KV cache gets %.2f GiB", peak / _GIB, num_blocks * per_block / _GIB)
        return num_blocks

    def initialize_kv_cache(self, config: KVCacheConfig) -> None:
        self.model_runner.initialize_kv_cache(config)

    def kv_cache_layout(self):
        """The runner's ``KVCacheLayout`` (for the scheduler-role KV connector)."""
        return self.model_runner.kv_cache_layout()

    def add_lora(self, lora_request) -> bool:
        """Register a LoRA adapter (``brigade.lora.LoRARequest``) with the runner; False when its id is taken."""
        return self.model_runner.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop a LoRA adapter from the runner; False when no adapter has that id."""
        return self.model_runner.remove_lora(lora_int_id)

    def execute_model(self, scheduler_output: SchedulerOutput, *,
                      overlap: bool = False) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output, overlap=overlap)

    def execute_dummy_batch(self) -> None:
        """One forward pass of a dummy token (``ModelRunner.execute_dummy_batch``)."""
        self.model_runner.execute_dummy_batch()

    def shutdown(self) -> None:
        """Release what the runner holds outside its tensors (the worker-role KV connector's threads and sockets)."""
        self.model_runner.shutdown()
