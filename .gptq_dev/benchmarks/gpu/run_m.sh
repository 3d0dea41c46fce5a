#!/usr/bin/env bash
# Session 4, call M: batch-1 latency A/B of the two prepared decode changes (rotary + KV write inside the
# decode kernel, BRIGADE_CUDA_DECODE_ROPE=1; one-split decode graphs for contexts up to 512 tokens,
# BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN=512), the GPU tests of both, the short-context decode sweep, and a
# profile with graph replay time. The A/B runs use --max-num-seqs 1 (only the batch-1 graphs are captured:
# the same graphs, a shorter start).
source "$(dirname "$0")/common.sh"
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -2 "$out/roofline.json"
lat() { name=$1; shift; STEP_TIMEOUT=90 TAIL=3 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --max-num-seqs 1 --output-json "$out/latency_$name.json"; }
lat default
lat decode_rope BRIGADE_CUDA_DECODE_ROPE=1
lat single_split BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN=512
lat both BRIGADE_CUDA_DECODE_ROPE=1 BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN=512
lat default2
STEP_TIMEOUT=150 TAIL=6 run env BRIGADE_CUDA_DECODE_ROPE=1 python3 -m pytest -q -x tests/cuda/test_llama_triton.py \
    tests/cuda/test_engine_gpu.py tests/cuda/test_triton_attention.py
STEP_TIMEOUT=100 TAIL=30 run env PYTHONPATH=/tmp/site:core:builtin_platforms/cuda python3 benchmarks/kernels/bench_attention.py \
    --short-only --json "$out/decode_short.json"
STEP_TIMEOUT=90 TAIL=12 run env BRIGADE_CUDA_DECODE_ROPE=1 BRIGADE_CUDA_DECODE_SINGLE_SPLIT_LEN=512 \
    python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile_both.json"
