#!/usr/bin/env bash
# Session 8 (kernel since reverted, see benchmarks/kernels/NOTES.md item 10): the few-row CUDA-core GEMV, first
# form ([ROWS, N, K] product). Sweep its tiles per shape and row count against the tensor-core skinny kernel and
# cuBLAS, then the GEMM tests. Not runnable on main: the kernel and `bench_gemm.py --gemv-rows` were dropped uncommitted.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=420 TAIL=30 run env PYTHONPATH=/tmp/site:benchmarks/kernels python3 benchmarks/kernels/bench_gemm.py \
    --gemv-rows 2,4,8 --compile-workers 14 --json "$out/gemv_rows_sweep.json" \
    --write-tiles builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json
cp builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json "$out/"
STEP_TIMEOUT=150 TAIL=8 run python3 -m pytest -q -p no:warnings tests/cuda/test_triton_gemm.py
