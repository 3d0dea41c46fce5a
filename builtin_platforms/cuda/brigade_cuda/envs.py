"""brigade-cuda's ``BRIGADE_CUDA_*`` environment variables: the benchmark A/B switches among its kernels, declared
once with type, default and meaning, and read when used (``brigade_cuda.envs.BRIGADE_CUDA_PDL``), never at import.
docs/environment.md lists them with the core's (``brigade.envs``)."""

from __future__ import annotations

from brigade.envs import EnvVar, declare, lazy_getattr

VARIABLES = declare(
    EnvVar("BRIGADE_CUDA_SKINNY_GEMM", "bool", True,
           "0: cuBLAS for every dense GEMM shape (no skinny GEMM, GEMV or fused GEMM variants are registered)."),
    EnvVar("BRIGADE_CUDA_GEMV", "bool", True,
           "0: the tensor-core skinny kernel at one row too, and a separate activation kernel."),
    EnvVar("BRIGADE_CUDA_NORM_FOLD", "bool", True,
           "0: the RMSNorm kernels stay and norm weights are not folded into the following projections."),
    EnvVar("BRIGADE_CUDA_FUSED_SAMPLER", "bool", True, "0: plain batches take the Sampler's tensor ops."),
    EnvVar("BRIGADE_CUDA_GEMM_TILES", "str", None,
           "Path of a tile table (JSON, as ops/gemm_tiles.json) to use instead of the shipped one."),
    EnvVar("BRIGADE_CUDA_FUSED_ROPE_KV", "bool", True, "0: rotary embedding and the KV-cache write as two kernels."),
    EnvVar("BRIGADE_CUDA_DECODE_ROPE", "bool", True,
           "0: pure-decode steps keep the fused rotary + KV-write kernel instead of rotating inside decode attention."),
    EnvVar("BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN", "int", 0,
           "Contexts up to this many tokens decode in one split with no merge kernel; 0 turns it off."),
    EnvVar("BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN", "str", "512",
           "Comma-separated context lengths that get their own small-batch decode graphs; 0 for none."),
    EnvVar("BRIGADE_CUDA_MLA_DECODE", "bool", False,
           "1: DeepSeek's latent-attention decode runs the Triton kernel (checked only under the Triton interpreter "
           "so far); 0: the PyTorch path."),
    EnvVar("BRIGADE_CUDA_PDL", "bool", True, "0: no programmatic dependent launch between kernels (sm_90+)."),
    EnvVar("BRIGADE_CUDA_PDL_EARLY", "bool", False, "1: trigger the next kernel's launch before waiting."),
    EnvVar("BRIGADE_CUDA_PDL_PREFETCH", "bool", True,
           "0: every load waits for the previous kernel (no step-invariant prefetch before the wait)."),
)

__getattr__ = lazy_getattr(VARIABLES)
