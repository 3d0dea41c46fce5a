"""CudaWorker: the core Worker plus the CUDA-only start-up step of binding the Triton ops."""

from __future__ import annotations

from brigade.worker.worker import Worker


class CudaWorker(Worker):
    """Registers the fused Triton ops for the "cuda" device type before the model is built.

    ``CustomOp`` binds each layer to an implementation when the layer is constructed, so registration
    must happen before ``load_model``; doing it in ``init_device`` also keeps it out of detection and
    import time. ``register_cuda_ops`` is idempotent, so a forked or re-created worker may call it again.
    """

    def init_device(self, hf_config) -> None:
        from brigade_cuda.ops import register_cuda_ops

        register_cuda_ops()
        super().init_device(hf_config)
