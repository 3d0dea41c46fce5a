"""CudaWorker: the core Worker plus the CUDA-only start-up step: watching for Triton kernels compiled after
start-up (``compile_watch``). The Triton kernels themselves come through the plugin's ``register_kernels``
hook and bind when the model is built."""

from __future__ import annotations

from brigade.worker.worker import Worker


class CudaWorker(Worker):
    """Starts the compile watch before the model is built, and marks the end of start-up after the KV cache,
    graphs and warm-ups."""

    def init_device(self, hf_config) -> None:
        from brigade_cuda import compile_watch

        compile_watch.watch()
        super().init_device(hf_config)

    def initialize_kv_cache(self, config) -> None:
        """The core step (KV cache, decode graphs, warm-ups), then every Triton compile is logged as a
        WARNING: the start-up is over, and a kernel variant compiled now stalls running requests."""
        from brigade_cuda import compile_watch

        super().initialize_kv_cache(config)
        compile_watch.mark_serving()
