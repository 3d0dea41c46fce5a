#!/usr/bin/env bash
# Session 5, call R: the fused sampler's GPU tests (and the engine against HF with it on), batch-1 latency
# with and without it, decode profiles with the work between two graphs (greedy, and temperature 1.0 as the
# latency benchmark samples), and this machine's bound.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=4 run env BRIGADE_CUDA_FUSED_SAMPLER=1 python3 -m pytest -q -x -p no:warnings \
    tests/cuda/test_fused_sampler_cuda.py tests/cuda/test_engine_gpu.py
lat fused_sampler_1 BRIGADE_CUDA_FUSED_SAMPLER=1
lat fused_sampler_0
prof() { name=$1; var=$2; shift 2; STEP_TIMEOUT=70 TAIL=30 run env $var python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile_$name.json" "$@"; }
prof t1_fused_0 BRIGADE_CUDA_FUSED_SAMPLER=0 --temperature 1.0
prof t1_fused_1 BRIGADE_CUDA_FUSED_SAMPLER=1 --temperature 1.0
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
