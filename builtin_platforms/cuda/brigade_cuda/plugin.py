"""brigade-cuda's plugin module (entry point ``cuda`` in ``brigade.platform_plugins``).

Registers the ``cuda`` platform, the CUDA attention backends and the Triton kernels of the core's ops. Every
value is a lazy "module:Attr" path, so loading this plugin on a machine without a GPU imports neither Triton
nor torch.cuda.

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


_OPS = "brigade_cuda.ops.custom_ops:"


@hookimpl
def register_kernels(register) -> None:
    """The fused Triton ops on the ``CustomOp`` seam (the fused mixture of experts and its router among them), the skinny GEMM /
    one-row GEMV with the SiLU-and-mul, residual-add and RMSNorm folds on the dense-GEMM seam, and the fused
    sampler; the A/B switches of ``brigade_cuda.envs`` (read here, at start-up) leave some of them out."""
    from brigade_cuda import envs

    register("rms_norm", "cuda", _OPS + "rms_norm_cuda")
    register("silu_and_mul", "cuda", _OPS + "silu_and_mul_cuda")
    register("rotary_embedding", "cuda", _OPS + "rotary_embedding_cuda")
    register("fused_moe", "cuda", "brigade_cuda.ops.fused_moe:fused_moe_cuda")
    register("moe_topk_router", "cuda", "brigade_cuda.ops.moe_router:topk_router_cuda")
    if envs.BRIGADE_CUDA_MLA_DECODE:  # off until a GPU has run it: the PyTorch latent decode
        register("mla_decode", "cuda", "brigade_cuda.attention.mla_decode:mla_decode_cuda")
    if envs.BRIGADE_CUDA_FUSED_SAMPLER:  # off: the Sampler's tensor ops (A/B)
        register("fused_sampler", "cuda", "brigade_cuda.ops.sampling:fused_sample")
    if envs.BRIGADE_CUDA_SKINNY_GEMM:  # off: cuBLAS for every shape (A/B)
        register("dense_gemm", "cuda", _OPS + "dense_gemm_cuda")
        register("silu_mul_gemm", "cuda", _OPS + "silu_mul_gemm_cuda")
        register("residual_gemm", "cuda", _OPS + "residual_gemm_cuda")
        if envs.BRIGADE_CUDA_NORM_FOLD:  # off: the norm kernels stay (A/B)
            register("rms_norm_gemm", "cuda", _OPS + "rms_norm_gemm_cuda")
