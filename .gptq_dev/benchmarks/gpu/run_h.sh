#!/usr/bin/env bash
# GPU session 3, call H: GPU tests, the cost of one kernel in a decode graph, the one-row GEMV sweep (tiles
# written to $out, not into the package), a per-kernel profile of batch-1 decode, and batch-1 latency A/B:
# main's path (GEMV and fused rotary+KV write off) against GEMV + SiLU fold, and + fused rotary/KV write.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=8 run python3 -m pytest -q -x tests/cuda
PYTHONPATH=$PYTHONPATH:core:builtin_platforms/cuda:benchmarks/kernels TAIL=6 run python3 benchmarks/kernels/bench_launch.py --json "$out/launch.json"
PYTHONPATH=$PYTHONPATH:core:builtin_platforms/cuda:benchmarks/kernels STEP_TIMEOUT=200 TAIL=9 run \
    python3 benchmarks/kernels/bench_gemm.py --gemv-only --json "$out/gemv_sweep.json" --write-tiles "$out/gemm_tiles.json"
export BRIGADE_CUDA_GEMM_TILES=$out/gemm_tiles.json
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -3 "$out/roofline.json"
lat() { name=$1; shift; TAIL=3 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_$name.json"; }
lat main BRIGADE_CUDA_GEMV=0 BRIGADE_CUDA_FUSED_ROPE_KV=0
lat gemv BRIGADE_CUDA_FUSED_ROPE_KV=0
lat gemv_rope BRIGADE_CUDA_GEMV=1
TAIL=20 run env BRIGADE_CUDA_PDL=0 python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile_nopdl.json"
TAIL=3 run python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile_pdl.json"
