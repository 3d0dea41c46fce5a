#!/usr/bin/env bash
# Session 6, final build (short-context decode graphs on, aligned input copies): benchmarks 2, 3 and 4 with the
# command lines of docs/benchmarks.md (bench 4's peers were last measured in session 1).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=3 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
STEP_TIMEOUT=100 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
STEP_TIMEOUT=200 TAIL=5 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 64 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --output-json "$out/peers_64.json"
