"""The Platform interface: the three device-id namespaces (an empty CUDA_VISIBLE_DEVICES counting as unset) and
the config choices a platform makes."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from brigade.config import BrigadeConfig, CacheConfig, ModelConfig
from brigade.platforms.cpu import CpuPlatform, detect_cpu
from brigade.platforms.interface import Platform


class _Gpu(Platform):
    name: ClassVar[str] = "gpu"
    device_type: ClassVar[str] = "cuda"
    device_control_env_var: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    worker_cls: ClassVar[str] = "vendor.worker.GpuWorker"
    default_block_size: ClassVar[int] = 64
    default_attention_backend: ClassVar[str] = "vendor_attn"


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_unset_empty_or_blank_visibility_means_every_device_with_identity_ids(monkeypatch, raw):
    if raw is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", raw)
    assert _Gpu.visible_device_ids() is None
    assert _Gpu.logical_to_physical(7) == 7 and _Gpu.physical_to_logical(7) == 7


def test_visible_list_remaps_logical_to_physical_and_back(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 5")
    assert _Gpu.visible_device_ids() == ["4", "5"]
    assert (_Gpu.logical_to_physical(0), _Gpu.logical_to_physical(1)) == (4, 5)
    assert (_Gpu.physical_to_logical(4), _Gpu.physical_to_logical(5)) == (0, 1)


def test_physical_id_that_is_not_visible_raises_runtime_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(RuntimeError, match="physical device 3 is not visible: CUDA_VISIBLE_DEVICES=4,5"):
        _Gpu.physical_to_logical(3)


def test_logical_id_past_the_visible_list_raises_index_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(IndexError, match="logical device 2 is not among the 2 visible devices"):
        _Gpu.logical_to_physical(2)


def test_platform_without_control_variable_ignores_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert CpuPlatform.visible_device_ids() is None and CpuPlatform.logical_to_physical(1) == 1


def test_check_and_update_config_fills_only_what_the_user_left_open():
    config = BrigadeConfig(ModelConfig(model="m"))
    _Gpu.check_and_update_config(config)
    assert config.parallel_config.worker_cls == "vendor.worker.GpuWorker"
    assert (config.cache_config.block_size, config.attention_backend, config.device) == (64, "vendor_attn", "cuda")
    chosen = BrigadeConfig(ModelConfig(model="m"), cache_config=CacheConfig(block_size=16),
                           attention_backend="reference")
    _Gpu.check_and_update_config(chosen)
    assert (chosen.cache_config.block_size, chosen.attention_backend) == (16, "reference")


def test_cpu_platform_is_always_detected_and_defaults_to_fp32():
    assert detect_cpu() is CpuPlatform
    assert CpuPlatform.resolve_dtype("auto", torch.bfloat16) == torch.float32
    assert CpuPlatform.device_for_rank(3) == torch.device("cpu")
    with pytest.raises(NotImplementedError):
        CpuPlatform.mem_get_info()


def test_cpu_default_step_budget_is_small_and_a_user_value_wins():
    """On the CPU one step of the 8192-token default can hold other requests for ~10 s; the CPU platform
    defaults to 1024-token chunks, and --max-num-batched-tokens (or no chunked prefill) still decides."""
    from brigade.config import BrigadeConfig, ModelConfig, SchedulerConfig
    from brigade.platforms.cpu import CPU_MAX_NUM_BATCHED_TOKENS, CpuPlatform

    default = BrigadeConfig(model_config=ModelConfig(model="m"))
    CpuPlatform.check_and_update_config(default)
    assert default.scheduler_config.max_num_batched_tokens == CPU_MAX_NUM_BATCHED_TOKENS == 1024
    chosen = BrigadeConfig(model_config=ModelConfig(model="m"),
                           scheduler_config=SchedulerConfig(max_num_batched_tokens=4096))
    CpuPlatform.check_and_update_config(chosen)
    assert chosen.scheduler_config.max_num_batched_tokens == 4096
    whole = BrigadeConfig(model_config=ModelConfig(model="m"),
                          scheduler_config=SchedulerConfig(enable_chunked_prefill=False))
    CpuPlatform.check_and_update_config(whole)
    assert whole.scheduler_config.max_num_batched_tokens is None  # resolve() sizes it to max_model_len


class _CudaLike(Platform):
    name: ClassVar[str] = "cuda_like"
    device_type: ClassVar[str] = "cuda"
    device_control_env_var: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"


def test_empty_visible_devices_counts_as_unset(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _CudaLike.visible_device_ids() is None
    assert [_CudaLike.logical_to_physical(i) for i in range(3)] == [0, 1, 2]
    assert _CudaLike.physical_to_logical(5) == 5
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _CudaLike.logical_to_physical(2) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert _CudaLike.logical_to_physical(0) == 4  # set: the list remaps


def test_overlap_and_graphs_are_capabilities_the_platform_declares():
    from brigade.platforms.interface import TorchCudaPlatform
    from brigade_cuda.platform import CudaPlatform
    from brigade_oot_platform.platform import OotPlatform
    from brigade_rocm.platform import RocmPlatform

    declared = {p.name: (p.supports_async_scheduling(), p.supports_cuda_graphs())
                for p in (Platform, CpuPlatform, OotPlatform, CudaPlatform, RocmPlatform)}
    assert declared == {"unspecified": (False, False), "cpu": (False, False), "oot": (False, False),
                        "cuda": (True, True), "rocm": (True, True)}
    assert _Gpu.supports_async_scheduling() is False  # a device type named "cuda" alone grants nothing
    assert TorchCudaPlatform.supports_async_scheduling() is True
