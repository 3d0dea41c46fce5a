"""CustomOp: a model op with a portable PyTorch forward and per-device fast implementations.

The seam, for platform and kernel authors
-----------------------------------------
Every small op that is worth a fused kernel (RMSNorm, rotary embedding, SiluAndMul) subclasses
``CustomOp`` and writes ``forward_native`` in plain PyTorch. That is the CPU path and the oracle the
fast versions are checked against.

A platform plugin supplies a faster version through the ``register_kernels`` hook, under the op's
``op_name`` (``brigade.plugins.kernels.KERNEL_OPS`` lists them)::

    @hookimpl
    def register_kernels(register):
        register("rms_norm", "my_accel", "my_accel.ops:rms_norm")   # same contract as forward_native

Each op is bound once, at construction, to the kernel the active platform's plugins registered when the
model is built on that platform's device type (``torch.get_default_device()``; the loader builds under
``with torch.device(device)``), or to ``forward_native`` otherwise. Nothing is looked up per step.

The registered function receives the op module first, so it reads the op's own parameters and
constants (each op's docstring lists them), then the same arguments as ``forward_native``, and must
return what ``forward_native`` returns. It may work in place on its inputs when the docstring allows.

``op_name`` is not inherited: a subclass with different math (say a Gemma-style norm) never takes its
parent's kernel by accident; it declares its own op name when a kernel exists for it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from brigade.plugins.kernels import kernel_for


class CustomOp(nn.Module):
    """Base class of swappable ops.

    Invariant: ``self.forward`` runs exactly the implementation chosen at construction
    (``self.impl_name`` says which: ``"native"`` or the device type whose platform's kernel won).
    """

    op_name: ClassVar[str | None] = None
    """The kernel op this class's instances bind (``KERNEL_OPS``), or None for forward_native only."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.op_name = cls.__dict__.get("op_name")  # per subclass; see the module docstring

    def __init__(self) -> None:
        super().__init__()
        impl = None if self.op_name is None else kernel_for(self.op_name)
        self._impl = impl
        self.impl_name = "native" if impl is None else torch.get_default_device().type

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """The plain PyTorch implementation; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must define forward_native")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._impl is None:
            return self.forward_native(*args, **kwargs)
        return self._impl(self, *args, **kwargs)
