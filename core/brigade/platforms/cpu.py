"""The CPU platform: the core's fallback, registered through the same hook as plugin platforms."""

from __future__ import annotations

from typing import ClassVar

import torch

from brigade.platforms.interface import Platform


class CpuPlatform(Platform):
    """Runs the engine in fp32 (or bf16) on the host with the ``cpu`` attention backend (the reference
    backend with a compiled decode kernel; ``--attention-backend reference`` selects the pure-PyTorch one)."""

    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"
    default_attention_backend: ClassVar[str] = "cpu"
    default_dtype: ClassVar[torch.dtype] = torch.float32


def detect_cpu() -> type[Platform]:
    """The CPU is always there."""
    return CpuPlatform
