"""Triton attention kernels for CUDA GPUs and the ``triton`` attention backend built on them."""

from brigade_cuda.attention.decode import choose_num_splits, decode_attention
from brigade_cuda.attention.kv_write import write_kv_cache
from brigade_cuda.attention.prefill import prefill_attention
from brigade_cuda.attention.rotary_kv_write import rotary_write_kv_cache
from brigade_cuda.attention.triton_backend import TritonAttentionBackend

__all__ = ["TritonAttentionBackend", "choose_num_splits", "decode_attention", "prefill_attention",
           "rotary_write_kv_cache", "write_kv_cache"]
