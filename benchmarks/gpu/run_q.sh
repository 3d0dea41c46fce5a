#!/usr/bin/env bash
# Prepared in session 4, not run (its device time ran out): the fused sampler's GPU tests and the engine
# against HF with it on, then batch-1 latency with it (BRIGADE_CUDA_FUSED_SAMPLER=1) and without (the default),
# then the bound of this machine.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=90 TAIL=4 run env BRIGADE_CUDA_FUSED_SAMPLER=1 python3 -m pytest -q -x -p no:warnings tests/cuda/test_fused_sampler_cuda.py \
    tests/cuda/test_engine_gpu.py
lat() { name=$1; shift; STEP_TIMEOUT=60 TAIL=2 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --max-num-seqs 1 --output-json "$out/latency_$name.json"; }
lat fused_sampler_1 BRIGADE_CUDA_FUSED_SAMPLER=1
lat fused_sampler_0
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
