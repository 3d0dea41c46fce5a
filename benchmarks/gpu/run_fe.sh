#!/usr/bin/env bash
# Session 12, call FE: brigade-gptq's GEMM with split-K at decode sizes (the rule brigade-awq has used since session
# 11, now shared through brigade_cuda.ops.quant_gemm): both plugins' GPU tests, then the GPTQ kernel benchmark with
# the chosen split against split 1 (and cuBLAS on the dense bf16 weight), then AWQ's, on the shared code.
source "$(dirname "$0")/common.sh"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e builtin_quant/gptq -e builtin_quant/awq 2>&1 | tail -2
STEP_TIMEOUT=300 TAIL=8 run python3 -m pytest -q -p no:warnings tests/cuda/test_gptq_triton.py tests/cuda/test_awq_triton.py
STEP_TIMEOUT=150 TAIL=20 run python3 benchmarks/kernels/bench_gptq_gemm.py --json "$out/bench_gptq_gemm.json"
