"""brigade-cuda's plugin module (entry point ``cuda`` in ``brigade.platform_plugins``).

Registers the ``cuda`` platform and the CUDA attention backends. Every value is a lazy "module:Attr"
path, so loading this plugin on a machine without a GPU imports neither Triton nor torch.cuda.

Kernel authors: add attention backends in ``register_attention_backends`` below (one ``register`` call
each, name -> "brigade_cuda.attention.<module>:<Class>"); select them with ``--attention-backend NAME``
or make one the default through ``CudaPlatform.default_attention_backend``.
"""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.x"


@hookimpl
def register_platforms(register) -> None:
    register("cuda", "brigade_cuda.platform:detect_cuda")


@hookimpl
def register_attention_backends(register) -> None:
    register("triton", "brigade_cuda.attention.triton_backend:TritonAttentionBackend")
