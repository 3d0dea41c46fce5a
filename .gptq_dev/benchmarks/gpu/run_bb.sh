#!/usr/bin/env bash
# Session 8 (kernel since reverted, see benchmarks/kernels/NOTES.md item 10): the few-row GEMV, second form (one 2D
# accumulator per row). Sweep, test, then A/B end to end on bench 4's 128 ShareGPT-like prompts: step times by batch
# size with the GEMV up to 8 rows and at batch 1 only. Not runnable on main: the kernel was dropped uncommitted.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=300 TAIL=24 run env PYTHONPATH=/tmp/site:benchmarks/kernels python3 benchmarks/kernels/bench_gemm.py \
    --gemv-rows 2,4,8 --compile-workers 14 --json "$out/gemv_rows_sweep.json" \
    --write-tiles builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json
cp builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json "$out/"
STEP_TIMEOUT=150 TAIL=4 run python3 -m pytest -q -p no:warnings tests/cuda/test_triton_gemm.py
STEP_TIMEOUT=120 TAIL=30 run python3 benchmarks/gpu/profile_steps.py $M --num-prompts 128 --repeat 1 --json "$out/steps_rows8.json"
STEP_TIMEOUT=120 TAIL=30 run env BRIGADE_CUDA_GEMV_MAX_ROWS=1 python3 benchmarks/gpu/profile_steps.py $M --num-prompts 128 --repeat 1 \
    --json "$out/steps_rows1.json"
