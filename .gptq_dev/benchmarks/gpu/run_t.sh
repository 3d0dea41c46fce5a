#!/usr/bin/env bash
# Session 5, call T: L2 prefetch of the GEMV's first weight tiles before the PDL wait
# (BRIGADE_CUDA_GEMV_L2_PREFETCH tiles, off by default): engine against HF with it on, then the batch-1 A/B;
# then the official latency command (HF peer), both throughput benchmarks and serve at 16 req/s on the
# default build (norms folded, fused sampler).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=3 run env BRIGADE_CUDA_GEMV_L2_PREFETCH=2 python3 -m pytest -q -x -p no:warnings tests/cuda/test_engine_gpu.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
lat l2pf_0
lat l2pf_2 BRIGADE_CUDA_GEMV_L2_PREFETCH=2
lat l2pf_8 BRIGADE_CUDA_GEMV_L2_PREFETCH=8
STEP_TIMEOUT=150 TAIL=3 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
STEP_TIMEOUT=120 TAIL=3 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
STEP_TIMEOUT=100 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
python3 -m brigade.benchmarks.roofline $M > "$out/roofline_end.json"; tail -1 "$out/roofline_end.json"
