"""CustomOp: a model op with a portable PyTorch forward and per-device fast implementations.

The seam, for platform and kernel authors
-----------------------------------------
Every small op that is worth a fused kernel (RMSNorm, rotary embedding, SiluAndMul) subclasses
``CustomOp`` and writes ``forward_native`` in plain PyTorch. That is the CPU path and the oracle the
fast versions are checked against.

A platform supplies a faster version by registering a function for its torch device type::

    from brigade.model_executor.layers.layernorm import RMSNorm

    def rms_norm_triton(layer: RMSNorm, x, residual=None): ...   # same contract as forward_native

    RMSNorm.register_impl("cuda", rms_norm_triton)

Each op is bound once, at construction, to the implementation registered for the device type the
model is being built on (``torch.get_default_device()``; the loader builds under
``with torch.device(device)``), or to ``forward_native`` when none is registered. Nothing is looked up
per step. Registrations are per process and must happen in the process that builds the model (the
worker; spawned workers start empty), before ``load_model``, e.g. in the platform's worker start-up,
never at import time. Models built earlier keep the implementation they were bound to.

The registered function receives the op module first, so it reads the op's own parameters and
constants (each op's docstring lists them), then the same arguments as ``forward_native``, and must
return what ``forward_native`` returns. It may work in place on its inputs when the docstring allows.

Registrations live in a dict owned by each subclass (created in ``__init_subclass__``), so a subclass
with different math (say a Gemma-style norm) never inherits its parent's kernel by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn


class CustomOp(nn.Module):
    """Base class of swappable ops.

    Invariant: ``self.forward`` runs exactly the implementation chosen at construction
    (``self.impl_name`` says which: ``"native"`` or the device type whose registered function won).
    """

    _impls: ClassVar[dict[str, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._impls = {}  # per subclass; see the module docstring

    @classmethod
    def register_impl(cls, device_type: str, impl: Callable[..., Any]) -> None:
        """Use ``impl(op, *args)`` instead of ``forward_native`` for ops later built on ``device_type``.

        Raises ValueError when ``device_type`` already has a different implementation, so two plugins
        cannot silently replace each other's kernels.
        """
        existing = cls._impls.get(device_type)
        if existing is not None and existing is not impl:
            raise ValueError(f"{cls.__name__} already has a {device_type} implementation "
                             f"({existing.__module__}.{existing.__qualname__}); "
                             f"call unregister_impl({device_type!r}) first to replace it")
        cls._impls[device_type] = impl

    @classmethod
    def unregister_impl(cls, device_type: str) -> None:
        """Forget the implementation for ``device_type`` (ops built afterwards use forward_native)."""
        cls._impls.pop(device_type, None)

    @classmethod
    def registered_impl(cls, device_type: str) -> Callable[..., Any] | None:
        """The function registered for ``device_type``, or None."""
        return cls._impls.get(device_type)

    def __init__(self) -> None:
        super().__init__()
        device_type = torch.get_default_device().type
        impl = type(self).registered_impl(device_type)
        self._impl = impl
        self.impl_name = "native" if impl is None else device_type

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """The plain PyTorch implementation; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must define forward_native")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._impl is None:
            return self.forward_native(*args, **kwargs)
        return self._impl(self, *args, **kwargs)
