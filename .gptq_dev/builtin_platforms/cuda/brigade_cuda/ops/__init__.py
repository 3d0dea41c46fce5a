"""Fused Triton ops for CUDA GPUs (RMSNorm with residual, rotary embedding, SiluAndMul) and their
binding to the model layers' ``CustomOp`` seam."""

from brigade_cuda.ops.activation import silu_and_mul
from brigade_cuda.ops.custom_ops import register_cuda_ops
from brigade_cuda.ops.layernorm import fused_add_rms_norm, rms_norm
from brigade_cuda.ops.rotary import rotary_embedding

__all__ = ["fused_add_rms_norm", "register_cuda_ops", "rms_norm", "rotary_embedding", "silu_and_mul"]
