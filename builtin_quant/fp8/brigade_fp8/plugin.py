"""brigade-fp8's plugin module (entry point ``fp8`` in ``brigade.general_plugins``).

Registers the methods as lazy ``"module:Attr"`` strings so that loading the plugin imports no torch code: ``fp8``
(online, and ``quant_method: "fp8"`` checkpoints) and ``compressed-tensors`` (its FP8 schemes); and the W8A16
decode kernels of its layers on the "cuda" platform (``decode_gemm``: the kernel ops ``fp8_gemm``,
``fp8_silu_mul_gemm`` and ``fp8_residual_gemm``). The kernels are registered here rather than by brigade-cuda
because their contract is this package's weight format; their Triton source is brigade-cuda's bf16 decode
kernels (one source, a constexpr switch), imported only when a layer on a CUDA device binds them, which needs the
"cuda" platform, hence brigade-cuda, to be active. ``BRIGADE_FP8_DECODE_ROWS=0`` (read here) registers none.
"""

from __future__ import annotations

from brigade.plugins import hookimpl

BRIGADE_HOOKSPEC_VERSION = "1.0"


@hookimpl
def register_quantization_methods(register) -> None:
    register("fp8", "brigade_fp8.config:Fp8Config")
    register("compressed-tensors", "brigade_fp8.compressed_tensors_config:CompressedTensorsFp8Config")


@hookimpl
def register_kernels(register) -> None:
    from brigade_fp8 import envs

    if envs.BRIGADE_FP8_DECODE_ROWS <= 0:  # A/B: torch._scaled_mm at every size
        return
    register("fp8_gemm", "cuda", "brigade_fp8.decode_gemm:fp8_decode_gemm")
    register("fp8_silu_mul_gemm", "cuda", "brigade_fp8.decode_gemm:fp8_silu_mul_gemm")
    register("fp8_residual_gemm", "cuda", "brigade_fp8.decode_gemm:fp8_residual_gemm")
