"""brigade-gptq's environment variable, declared once with type, default and meaning and read when used
(``brigade_gptq.envs.BRIGADE_GPTQ_TRITON``); docs/environment.md lists it with the core's."""

from __future__ import annotations

from brigade.envs import EnvVar, declare, lazy_getattr

VARIABLES = declare(
    EnvVar("BRIGADE_GPTQ_TRITON", "bool", True,
           "0: GPTQ layers on CUDA use the PyTorch dequantize-then-matmul path instead of the Triton GEMM."),
)

__getattr__ = lazy_getattr(VARIABLES)
