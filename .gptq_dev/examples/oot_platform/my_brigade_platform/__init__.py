"""my-brigade-platform: the smallest useful out-of-tree Brigade platform (a template to copy)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch

from brigade.platforms.interface import Platform
from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


class MyAccelPlatform(Platform):
    """Replace the values with your hardware's; the core reads only these attributes and methods."""

    name: ClassVar[str] = "myaccel"
    device_type: ClassVar[str] = "cpu"  # your torch device type, e.g. "xpu" or a PrivateUse1 name
    dist_backend: ClassVar[str] = "gloo"  # your torch.distributed backend
    device_control_env_var: ClassVar[str | None] = "MYACCEL_VISIBLE_DEVICES"
    default_attention_backend: ClassVar[str] = "reference"  # or one your package registers
    worker_cls: ClassVar[str] = "brigade.worker.worker.Worker"  # or your Worker subclass
    default_dtype: ClassVar[torch.dtype] = torch.bfloat16

    @classmethod
    def mem_get_info(cls) -> tuple[int, int]:
        raise NotImplementedError("return (free, total) bytes of the current device")


def detect() -> type[Platform] | None:
    """Present when the device node exists; reading the file system opens nothing."""
    return MyAccelPlatform if Path("/dev/myaccel0").exists() else None


@hookimpl
def register_platforms(register) -> None:
    register("myaccel", detect)
