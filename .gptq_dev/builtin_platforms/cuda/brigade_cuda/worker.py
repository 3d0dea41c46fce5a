"""CudaWorker: the core Worker plus the CUDA-only start-up steps: binding the Triton ops, and watching for
Triton kernels compiled after start-up (``compile_watch``)."""

from __future__ import annotations

from brigade.worker.worker import Worker


class CudaWorker(Worker):
    """Registers the fused Triton ops for the "cuda" device type before the model is built.

    ``CustomOp`` binds each layer to an implementation when the layer is constructed, so registration
    must happen before ``load_model``; doing it in ``init_device`` also keeps it out of detection and
    import time. ``register_cuda_ops`` is idempotent, so a forked or re-created worker may call it again.
    """

    def init_device(self, hf_config) -> None:
        from brigade_cuda import compile_watch
        from brigade_cuda.ops import register_cuda_ops

        compile_watch.watch()
        register_cuda_ops()
        super().init_device(hf_config)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """The core step (KV cache, decode graphs, warm-ups), then every Triton compile is logged as a
        WARNING: the start-up is over, and a kernel variant compiled now stalls running requests."""
        from brigade_cuda import compile_watch

        super().initialize_kv_cache(num_blocks)
        compile_watch.mark_serving()
