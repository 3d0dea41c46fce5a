#!/usr/bin/env bash
# GPU session C (one device call): skinny-GEMM correctness, tile sweep against cuBLAS (writes the tiles the
# kernel reads), then batch-1 latency with the skinny GEMM and with cuBLAS only (A/B in the same run).
source "$(dirname "$0")/common.sh"
T=builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json
run python3 -m pytest -q -x tests/cuda/test_triton_gemm.py
STEP_TIMEOUT=220 TAIL=12 run env PYTHONPATH=/tmp/site:core:builtin_platforms/cuda:benchmarks/kernels \
    python3 benchmarks/kernels/bench_gemm.py --json "$out/gemm_sweep.json" --write-tiles $T
cp $T "$out/" 2>/dev/null
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -3 "$out/roofline.json"
TAIL=8 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_skinny.json"
TAIL=8 run env BRIGADE_CUDA_SKINNY_GEMM=0 brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_cublas.json"
