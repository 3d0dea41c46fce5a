"""brigade-awq's environment variable, declared once with type, default and meaning and read when used
(``brigade_awq.envs.BRIGADE_AWQ_TRITON``); docs/environment.md lists it with the core's."""

from __future__ import annotations

from brigade.envs import EnvVar, declare, lazy_getattr

VARIABLES = declare(
    EnvVar("BRIGADE_AWQ_TRITON", "bool", True,
           "0: AWQ layers on CUDA use the PyTorch dequantize-then-matmul path instead of the Triton GEMM."),
)

__getattr__ = lazy_getattr(VARIABLES)
