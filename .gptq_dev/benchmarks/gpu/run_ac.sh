#!/usr/bin/env bash
# Session 7: bench 4's peers again on a larger subset of bench 3's ShareGPT-like prompts (the first 128),
# every HF generate batch holding all 128 (padded to the longest prompt, run to the longest output), to see
# whether run_ab's 20.8x over the better peer holds with more prompts.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=560 TAIL=6 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --hf-batch-size 128 --output-json "$out/peers_sharegpt_128.json"
