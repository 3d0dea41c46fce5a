"""The rocm platform: AMD GPUs through a HIP build of PyTorch.

A HIP build exposes AMD GPUs through ``torch.cuda`` with device type "cuda" and speaks RCCL through
torch.distributed's "nccl" backend, so only detection and the visibility variable differ from CUDA.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from brigade.platforms.interface import Platform, TorchCudaPlatform


class RocmPlatform(TorchCudaPlatform):
    """AMD GPUs: HIP_VISIBLE_DEVICES picks devices, RCCL (as "nccl") between workers, bf16 by default."""

    name: ClassVar[str] = "rocm"
    device_control_env_var: ClassVar[str | None] = "HIP_VISIBLE_DEVICES"
    default_attention_backend: ClassVar[str] = "reference"


def detect_rocm() -> type[Platform] | None:
    """RocmPlatform when PyTorch is a HIP build (``torch.version.hip`` is set), else None.

    Reads a version string only: no HIP runtime call, so no device context and nothing fork-unsafe.
    """
    return RocmPlatform if getattr(torch.version, "hip", None) else None
