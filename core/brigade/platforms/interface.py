"""The Platform interface: one class per kind of hardware.

A platform plugin's detector returns a Platform subclass or None, with no side effects (it must not
create a CUDA context). The chosen class is used through class methods; it holds no per-process state.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from brigade.config import BrigadeConfig


class Platform:
    """Hardware facts and hooks the core asks about; subclasses override the class attributes.

    Three device-id namespaces:
      * logical: the index torch uses inside this process (0 .. number of visible devices - 1);
      * visible: the entry of ``device_control_env_var`` (e.g. CUDA_VISIBLE_DEVICES) at that index;
      * physical: the id of the device on the host. Visible ids are physical ids for NVIDIA and AMD.
    An unset or empty control variable means every device is visible and logical == physical.
    """

    name: ClassVar[str] = "unspecified"
    device_type: ClassVar[str] = "cpu"  # torch device type
    dist_backend: ClassVar[str] = "gloo"  # torch.distributed backend for its workers
    device_control_env_var: ClassVar[str | None] = None
    default_attention_backend: ClassVar[str] = "reference"
    default_block_size: ClassVar[int] = 16
    worker_cls: ClassVar[str] = "brigade.worker.worker.Worker"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    default_dtype: ClassVar[torch.dtype] = torch.float32  # for --dtype auto when the config says nothing
    # How the front end starts its EngineCore processes. "spawn" (a fresh interpreter: the safe choice for a device
    # runtime a forked child cannot use once the parent touched it, as CUDA's) or "fork" (the child starts with the
    # front end's imports, torch's and transformers' among them: seconds less per engine; vLLM forks its engine
    # core the same way when CUDA is not initialized).
    engine_start_method: ClassVar[str] = "spawn"

    # ---- device ids ---------------------------------------------------------------------------
    @classmethod
    def visible_device_ids(cls) -> list[str] | None:
        """The parsed control variable, or None when it is unset or empty (both mean all devices)."""
        if cls.device_control_env_var is None:
            return None
        raw = os.environ.get(cls.device_control_env_var)
        if raw is None or raw.strip() == "":
            return None
        return [part.strip() for part in raw.split(",") if part.strip()]

    @classmethod
    def logical_to_physical(cls, logical_id: int) -> int:
        """Map a torch device index to the host's device id. Raises IndexError past the visible list."""
        visible = cls.visible_device_ids()
        if visible is None:
            return logical_id
        if not 0 <= logical_id < len(visible):
            raise IndexError(f"logical device {logical_id} is not among the {len(visible)} visible devices "
                             f"({cls.device_control_env_var}={','.join(visible)})")
        return int(visible[logical_id])

    @classmethod
    def physical_to_logical(cls, physical_id: int) -> int:
        """Map a host device id to the torch index. Raises RuntimeError when the device is not visible."""
        visible = cls.visible_device_ids()
        if visible is None:
            return physical_id
        try:
            return visible.index(str(physical_id))
        except ValueError:
            raise RuntimeError(f"physical device {physical_id} is not visible: "
                               f"{cls.device_control_env_var}={','.join(visible)}") from None

    @classmethod
    def physical_device_count(cls) -> int | None:
        """Devices on the host, counted without initialising the device runtime (no CUDA context: the caller may
        fork afterwards); None where the platform cannot tell. Platform plugins override it."""
        return None

    @classmethod
    def device_count(cls) -> int | None:
        """Devices this process may use: the length of ``device_control_env_var``'s list when it is set, else
        ``physical_device_count()``. None on a platform without devices (the host: no limit) or when unknown."""
        if cls.device_control_env_var is None:
            return None
        visible = cls.visible_device_ids()
        return len(visible) if visible is not None else cls.physical_device_count()

    # ---- configuration ------------------------------------------------------------------------
    @classmethod
    def check_and_update_config(cls, config: BrigadeConfig) -> None:
        """Fill in platform choices the user left open: worker class, block size, attention backend."""
        if config.parallel_config.worker_cls == "auto":
            config.parallel_config.worker_cls = cls.worker_cls
        if config.cache_config.block_size is None:
            config.cache_config.block_size = cls.default_block_size
        if config.attention_backend is None:
            config.attention_backend = cls.default_attention_backend
        config.device = cls.device_type

    @classmethod
    def resolve_dtype(cls, requested: str, config_dtype: torch.dtype | None) -> torch.dtype:
        """Turn --dtype into a torch dtype this platform supports. Raises ValueError when it cannot."""
        aliases = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
                   "half": torch.float16, "fp16": torch.float16, "float32": torch.float32,
                   "float": torch.float32, "fp32": torch.float32}
        if requested == "auto":
            dtype = config_dtype if (config_dtype in cls.supported_dtypes and cls.device_type != "cpu") \
                else cls.default_dtype
        else:
            dtype = aliases[requested]
        if dtype not in cls.supported_dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in cls.supported_dtypes)
            raise ValueError(f"dtype {dtype} is not supported on {cls.name}; use one of {names}")
        return dtype

    # ---- device operations --------------------------------------------------------------------
    @classmethod
    def device_for_rank(cls, local_rank: int) -> torch.device:
        """The torch device a worker of this local rank uses."""
        if cls.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(cls.device_type, local_rank)

    @classmethod
    def synchronize(cls) -> None:
        """Wait for the device's queued work."""

    @classmethod
    def mem_get_info(cls) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        raise NotImplementedError(f"{cls.name} does not report device memory")

    @classmethod
    def empty_cache(cls) -> None:
        """Return cached allocator memory to the device."""

    # ---- capabilities -------------------------------------------------------------------------
    @classmethod
    def supports_cuda_graphs(cls) -> bool:
        """Whether the model runner may capture device graphs (CUDA graphs) on this platform."""
        return False

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        """Whether the engine may overlap scheduling step N+1 with the device running step N by default
        (``--async-scheduling`` unset); needs asynchronous device work, so False on the host."""
        return False


class TorchCudaPlatform(Platform):
    """Base of platforms whose devices PyTorch drives through ``torch.cuda`` (NVIDIA CUDA builds and AMD HIP
    builds alike): device type "cuda", "nccl" between workers (RCCL on ROCm), bf16 by default, graph capture.

    Subclasses set ``name``, ``device_control_env_var``, the attention backend and worker, and keep their own
    side-effect-free detector (nothing here is called during detection).
    """

    device_type: ClassVar[str] = "cuda"
    dist_backend: ClassVar[str] = "nccl"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    default_dtype: ClassVar[torch.dtype] = torch.bfloat16

    @classmethod
    def synchronize(cls) -> None:
        torch.cuda.synchronize()

    @classmethod
    def mem_get_info(cls) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        return torch.cuda.mem_get_info()

    @classmethod
    def empty_cache(cls) -> None:
        torch.cuda.empty_cache()

    @classmethod
    def supports_cuda_graphs(cls) -> bool:
        return True  # CUDA graphs, or HIP graphs on ROCm

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True
