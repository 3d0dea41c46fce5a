"""Fused Triton ops for CUDA GPUs (RMSNorm with residual, rotary embedding, SiluAndMul); ``custom_ops`` adapts
them to the model layers' contracts, and the plugin registers them as the "cuda" platform's kernels."""

from brigade_cuda.ops.activation import silu_and_mul
from brigade_cuda.ops.layernorm import fused_add_rms_norm, rms_norm
from brigade_cuda.ops.rotary import rotary_embedding

__all__ = ["fused_add_rms_norm", "rms_norm", "rotary_embedding", "silu_and_mul"]
