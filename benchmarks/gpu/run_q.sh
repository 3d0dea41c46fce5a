#!/usr/bin/env bash
# Session 4, call Q (the last ~4 minutes of device time): the fused sampler's GPU tests and the engine against
# HF, then batch-1 latency with the fused sampler (default) and without (BRIGADE_CUDA_FUSED_SAMPLER=0), then
# the bound of this machine.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=90 TAIL=4 run python3 -m pytest -q -x -p no:warnings tests/cuda/test_fused_sampler.py tests/cuda/test_engine_gpu.py
lat() { name=$1; shift; STEP_TIMEOUT=60 TAIL=2 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --max-num-seqs 1 --output-json "$out/latency_$name.json"; }
lat fused_sampler_1
lat fused_sampler_0 BRIGADE_CUDA_FUSED_SAMPLER=0
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
