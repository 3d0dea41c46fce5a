"""to_device: a small host tensor copied to the sampling device without making the host wait.

A pageable host-to-device copy on CUDA waits until the stream's earlier work is done; under overlapped scheduling
that is the model's forward of the step being prepared, so one such copy in the sampler's set-up would undo the
overlap. A pinned copy is queued behind that work instead, and the host goes on.
"""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor, not used again by the caller) on ``device``; on CUDA through pinned memory with a
    non-blocking copy, elsewhere a plain ``.to``. Same shape and dtype."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
