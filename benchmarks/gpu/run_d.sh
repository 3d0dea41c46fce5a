#!/usr/bin/env bash
# GPU session D (one device call): every GPU test (kernels vs the reference backend, the skinny GEMM, engine
# greedy output vs transformers), then batch-1 latency with programmatic dependent launch on and off.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 BRIGADE_LOGGING_LEVEL=WARNING
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e builtin_platforms/cuda 2>&1 | tail -3
M=benchmarks/configs/llama-3.1-8b
C="--load-format dummy --dtype bfloat16 --skip-tokenizer-init"
run() { echo "+ $*"; timeout ${STEP_TIMEOUT:-150} "$@" 2>&1 | grep -v -i "warn\|deprecat" | tail -${TAIL:-25}; }
STEP_TIMEOUT=260 TAIL=15 run python3 -m pytest -q -x tests/cuda
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -3 "$out/roofline.json"
TAIL=6 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_pdl.json"
TAIL=6 run env BRIGADE_CUDA_PDL=0 brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_nopdl.json"
