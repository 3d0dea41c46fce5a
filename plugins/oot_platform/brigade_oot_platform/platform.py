"""OotPlatform: the example vendor's Platform subclass and its detector."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from brigade.platforms.interface import Platform
from brigade_oot_platform import envs

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
    def supports_async_scheduling(cls) -> bool:
        """No: its "device" is the host, where nothing runs asynchronously to overlap with (a real
        accelerator with a stream of its own returns True to get overlapped scheduling by default)."""
        return False

    @classmethod
    def supports_cuda_graphs(cls) -> bool:
        """No graph capture; a vendor whose runtime records and replays device work returns True."""
        return False

    @classmethod
    def check_and_update_config(cls, config: BrigadeConfig) -> None:
        """Pick the worker class, block size and attention backend the user left open (the core's
        defaults do exactly that from the class attributes above; a real vendor adds its own checks)."""
        super().check_and_update_config(config)


def detect_oot() -> type[Platform] | None:
    """OotPlatform when BRIGADE_OOT_DEVICE=1; reads one variable and has no side effects."""
    return OotPlatform if envs.BRIGADE_OOT_DEVICE == "1" else None
