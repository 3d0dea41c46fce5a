#!/usr/bin/env bash
# Prepared for the next GPU session (not run yet): the decode-rope path (BRIGADE_CUDA_DECODE_ROPE=1: rotary and
# the KV write inside the decode attention kernel) checked by the GPU tests, the model and engine tests run with
# it on, then batch-1 latency A/B against the default in one call.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=220 TAIL=8 run python3 -m pytest -q tests/cuda
STEP_TIMEOUT=200 TAIL=6 run env BRIGADE_CUDA_DECODE_ROPE=1 python3 -m pytest -q tests/cuda/test_llama_triton.py \
    tests/cuda/test_engine_gpu.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -2 "$out/roofline.json"
lat() { name=$1; shift; TAIL=3 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_$name.json"; }
lat default BRIGADE_CUDA_DECODE_ROPE=0
lat decode_rope BRIGADE_CUDA_DECODE_ROPE=1
TAIL=10 run env BRIGADE_CUDA_DECODE_ROPE=1 python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile_decode_rope.json"
