#!/usr/bin/env bash
# Session 4, call O: loads of step-invariant memory before the PDL wait (BRIGADE_CUDA_PDL_PREFETCH, on by
# default: the RMSNorm weight; the decode kernel's block table and cached K/V), the V tile issued with the K
# tile, the merge's loads issued together. Quick correctness first (decode-rope graph replay, engine against
# HF), then the batch-1 A/B, the official latency command, both throughput benchmarks, and all GPU tests.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=3 run python3 -m pytest -q -x -p no:warnings tests/cuda/test_rotary_kv_write.py -k graph \
    tests/cuda/test_engine_gpu.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
lat() { name=$1; shift; STEP_TIMEOUT=90 TAIL=2 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --max-num-seqs 1 --output-json "$out/latency_$name.json"; }
lat prefetch_1
lat prefetch_0 BRIGADE_CUDA_PDL_PREFETCH=0
STEP_TIMEOUT=200 TAIL=3 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
STEP_TIMEOUT=120 TAIL=3 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
STEP_TIMEOUT=100 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
STEP_TIMEOUT=240 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda
