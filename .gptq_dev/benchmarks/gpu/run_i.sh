#!/usr/bin/env bash
# GPU session 3, call I: every GPU test, the one-row GEMV sweep with its SiLU-and-mul and add-RMSNorm folds
# (tiles written to $out), then batch-1 latency A/B on those tiles: without the RMSNorm fold and the in-kernel
# decode merge, with the fold, with both (the default), and a per-kernel profile of the default.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=220 TAIL=8 run python3 -m pytest -q -x tests/cuda
PYTHONPATH=$PYTHONPATH:core:builtin_platforms/cuda:benchmarks/kernels STEP_TIMEOUT=200 TAIL=9 run \
    python3 benchmarks/kernels/bench_gemm.py --gemv-only --json "$out/gemv_sweep.json" --write-tiles "$out/gemm_tiles.json"
export BRIGADE_CUDA_GEMM_TILES=$out/gemm_tiles.json
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -2 "$out/roofline.json"
lat() { name=$1; shift; TAIL=3 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_$name.json"; }
lat no_norm_fold BRIGADE_CUDA_NORM_GEMV=0 BRIGADE_CUDA_DECODE_FUSED_MERGE=0
lat norm_fold BRIGADE_CUDA_DECODE_FUSED_MERGE=0
lat default BRIGADE_CUDA_NORM_GEMV=1
TAIL=14 run python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile_pdl.json"
