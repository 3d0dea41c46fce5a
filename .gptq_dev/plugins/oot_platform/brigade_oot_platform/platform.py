"""OotPlatform: the example vendor's Platform subclass and its detector."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

import torch

from brigade.platforms.interface import Platform

if TYPE_CHECKING:
    from brigade.config import BrigadeConfig

DEVICE_ENV = "BRIGADE_OOT_DEVICE"
"""Set to 1 to make the example "device" present."""


class OotPlatform(Platform):
    """A pretend accelerator that computes on the host: gloo between workers, fp32, its own worker and
    attention backend, and a larger KV block than the core's default (to show the platform choosing)."""

    name: ClassVar[str] = "oot"
    device_type: ClassVar[str] = "cpu"  # the torch device that really runs the tensors
    dist_backend: ClassVar[str] = "gloo"
    device_control_env_var: ClassVar[str | None] = "OOT_VISIBLE_DEVICES"
    default_attention_backend: ClassVar[str] = "oot"
    default_block_size: ClassVar[int] = 32
    worker_cls: ClassVar[str] = "brigade_oot_platform.worker.OotWorker"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)
    default_dtype: ClassVar[torch.dtype] = torch.float32

    @classmethod
    def check_and_update_config(cls, config: BrigadeConfig) -> None:
        """Pick the worker class, block size and attention backend the user left open (the core's
        defaults do exactly that from the class attributes above; a real vendor adds its own checks)."""
        super().check_and_update_config(config)


def detect_oot() -> type[Platform] | None:
    """OotPlatform when BRIGADE_OOT_DEVICE=1; reads one variable and has no side effects."""
    return OotPlatform if os.environ.get(DEVICE_ENV) == "1" else None
