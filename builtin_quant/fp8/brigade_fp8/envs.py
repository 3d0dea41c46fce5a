"""brigade-fp8's environment variables, declared once with type, default and meaning and read when used
(``brigade_fp8.envs.BRIGADE_FP8_DECODE_ROWS``); docs/environment.md lists them with the core's."""

from __future__ import annotations

from brigade.envs import EnvVar, declare, lazy_getattr

VARIABLES = declare(
    EnvVar("BRIGADE_FP8_DECODE_ROWS", "int", 16,
           "FP8 layers on CUDA multiply up to this many rows (at most 16) with the W8A16 decode kernels (bf16 "
           "activations, each FP8 weight byte read once) and larger batches with torch._scaled_mm; 1: the one-row "
           "GEMV only; 0: torch._scaled_mm at every size (A/B)."),
    EnvVar("BRIGADE_FP8_TRITON_GEMM_ROWS", "int", 64,
           "W8A8 FP8 products (per-token FP8 activations) of up to this many rows run brigade-fp8's Triton GEMM "
           "(narrow tiles, split-K) and larger ones torch._scaled_mm; 0: torch._scaled_mm at every size (A/B)."),
)

__getattr__ = lazy_getattr(VARIABLES)
