#!/usr/bin/env bash
# GPU benchmark session A (one device call): decode bound, latency (+HF generate), throughput 1024/128 and
# ShareGPT-like (1000 prompts each), and the HF peers on a 64-prompt subset. Results under $OUT.
source "$(dirname "$0")/common.sh"
python3 -m brigade.benchmarks.roofline $M | tee "$out/roofline.json"
STEP_TIMEOUT=${STEP_TIMEOUT:-200} run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 3 --hf-peer generate --output-json "$out/latency.json"
STEP_TIMEOUT=${STEP_TIMEOUT:-200} run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
STEP_TIMEOUT=${STEP_TIMEOUT:-200} run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
STEP_TIMEOUT=${STEP_TIMEOUT:-200} run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 64 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --output-json "$out/throughput_hf_peers.json"
