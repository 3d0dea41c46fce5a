#!/usr/bin/env bash
# GPU session D (one device call): every GPU test (kernels vs the reference backend, the skinny GEMM, engine
# greedy output vs transformers), then batch-1 latency with programmatic dependent launch on and off.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=260 TAIL=15 run python3 -m pytest -q -x tests/cuda
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -3 "$out/roofline.json"
TAIL=6 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_pdl.json"
TAIL=6 run env BRIGADE_CUDA_PDL=0 brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_nopdl.json"
