"""The CPU attention backend: the reference backend with its decode route compiled.

Prefill routes are the reference backend's (PyTorch SDPA over the step's own K/V, or over the gathered
context). Decode rows, most of a CPU step's attention time, go to ``csrc/cpu_attention.c``, which reads
K/V in place through the block tables instead of gathering them, with an online softmax in fp32
(``brigade.attention.cpu_kernels``). It takes the attention variants too: a sliding window (reading only the
window's blocks), a logit soft cap and sinks. A float8 e4m3 cache (``--kv-cache-dtype fp8``) decodes with the
reference route, which dequantizes the gathered blocks in PyTorch. When the kernels cannot be built (no C
compiler, say) the backend logs one warning with the reason and decodes with the reference route, so results
never depend on it.
"""

from __future__ import annotations

import logging

import torch

from brigade.attention import cpu_kernels
from brigade.attention.reference import ReferenceAttentionBackend

logger = logging.getLogger(__name__)


class CpuAttentionBackend(ReferenceAttentionBackend):
    """Paged attention on the CPU: compiled decode for float32/bfloat16 caches, reference routes otherwise (an fp8
    cache among them)."""

    name = "cpu"
    supported_devices = ("cpu",)
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True
    _kernel_error: str | None = None  # why the kernels are unavailable ("" when they loaded), once known

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, scale: float, **variants):
        super().__init__(num_heads, head_size, num_kv_heads, scale, **variants)
        self.use_kernel = self._kernels_available()

    @staticmethod
    def _kernels_available() -> bool:
        """Load the kernels once per process; the first failure is logged, once, with its reason."""
        if CpuAttentionBackend._kernel_error is None:
            try:
                cpu_kernels.load()
                CpuAttentionBackend._kernel_error = ""
            except cpu_kernels.KernelBuildError as e:
                CpuAttentionBackend._kernel_error = str(e)
                logger.warning("cpu attention: compiled decode kernel unavailable (%s); decoding with the "
                               "reference PyTorch route", e)
        return not CpuAttentionBackend._kernel_error

    def _decode(self, query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens_cpu: torch.Tensor) -> torch.Tensor:
        if (not self.use_kernel or query.dtype not in cpu_kernels.DECODE_DTYPES or kv_cache.dtype != query.dtype
                or not cpu_kernels.decode_supports(self.num_heads, self.num_kv_heads, self.head_size,
                                                   kv_cache.shape[2])):
            return super()._decode(query, kv_cache, block_table, seq_lens_cpu)
        return cpu_kernels.decode_attention(query, kv_cache, block_table, seq_lens_cpu, self.scale,
                                            self.num_kv_heads, sliding_window=self.sliding_window,
                                            logits_soft_cap=self.logits_soft_cap, sinks=self.sinks)
