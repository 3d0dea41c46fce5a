#!/usr/bin/env bash
# GPU session G (one device call), the final code: every GPU test, then benchmarks 1-3 of issue 4
# (latency with the HF generate peer, throughput 1024/128 and ShareGPT-like) with the skinny GEMM and PDL on.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=6 run python3 -m pytest -q -x tests/cuda
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -3 "$out/roofline.json"
TAIL=5 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
TAIL=5 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
TAIL=5 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
