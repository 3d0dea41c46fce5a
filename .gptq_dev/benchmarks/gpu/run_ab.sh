#!/usr/bin/env bash
# Prepared in session 6, not run (run_x's attempt ran past its 200 s step limit): bench 4's peers on 64 of
# bench 3's ShareGPT-like prompts (the issue allows "same model and prompts, a subset"); HF generate pads each
# batch of 64 to its longest prompt and generates its longest output, as in the 1024/128 run.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=560 TAIL=6 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 64 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --hf-batch-size 64 --output-json "$out/peers_sharegpt_64.json"
