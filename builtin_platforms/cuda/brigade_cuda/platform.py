"""The cuda platform and its side-effect-free detector.

Detection must not create a CUDA context or even initialise the CUDA driver in the detecting process:
EngineCore and workers may ``fork`` afterwards, and a forked child cannot use a driver its parent
initialised. So the detector never calls ``torch.cuda`` (``torch.cuda.device_count()`` may call
``cudaGetDeviceCount``); it asks NVML, a separate management library that is fork-safe, through ctypes,
and falls back to counting ``/dev/nvidiaN`` device nodes when NVML is not there.
"""

from __future__ import annotations

import ctypes
import logging
import re
from pathlib import Path
from typing import ClassVar

import torch

from brigade.platforms.interface import Platform, TorchCudaPlatform

logger = logging.getLogger(__name__)

_NVIDIA_NODE = re.compile(r"nvidia\d+")


class CudaPlatform(TorchCudaPlatform):
    """NVIDIA GPUs through torch.cuda: NCCL between workers, bf16 by default, CUDA graphs, Triton kernels.

    Device ids follow CUDA_VISIBLE_DEVICES (an empty value counts as unset, see ``Platform``).
    """

    name: ClassVar[str] = "cuda"
    device_control_env_var: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    default_attention_backend: ClassVar[str] = "triton"
    default_block_size: ClassVar[int] = 16
    worker_cls: ClassVar[str] = "brigade_cuda.worker.CudaWorker"

    @classmethod
    def device_count(cls) -> int | None:
        """The visible GPUs: CUDA_VISIBLE_DEVICES's entries, else NVML's count (or the device nodes), without
        initialising the CUDA driver (workers may fork afterwards)."""
        visible = cls.visible_device_ids()
        if visible is not None:
            return len(visible)
        count = nvml_device_count()
        return count if count is not None else count_nvidia_device_nodes()


def nvml_device_count(library: str = "libnvidia-ml.so.1") -> int | None:
    """Number of NVIDIA GPUs according to NVML, or None when NVML cannot be loaded or initialised.

    NVML does not touch the CUDA driver's per-process state, so this is safe before ``fork``.
    """
    try:
        nvml = ctypes.CDLL(library)
    except OSError as exc:
        logger.debug("NVML not available (%s); counting device nodes instead", exc)
        return None
    if nvml.nvmlInit_v2() != 0:  # 0 is NVML_SUCCESS
        logger.debug("nvmlInit_v2 failed; counting device nodes instead")
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        return int(count.value)
    finally:
        nvml.nvmlShutdown()


def count_nvidia_device_nodes(dev_dir: Path = Path("/dev")) -> int:
    """Number of ``/dev/nvidiaN`` nodes (one per GPU the container or host can open)."""
    if not dev_dir.is_dir():
        return 0
    return sum(1 for p in dev_dir.iterdir() if _NVIDIA_NODE.fullmatch(p.name))


def detect_cuda() -> type[Platform] | None:
    """CudaPlatform when torch was built with CUDA and an NVIDIA GPU is present, else None.

    No side effects: reads ``torch.version`` and asks NVML or the device nodes; never calls torch.cuda.
    """
    if torch.version.cuda is None or torch.version.hip is not None:
        return None
    count = nvml_device_count()
    if count is None:
        count = count_nvidia_device_nodes()
    return CudaPlatform if count > 0 else None
