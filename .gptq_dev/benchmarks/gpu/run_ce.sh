#!/usr/bin/env bash
# Session 9, call CE: what LoRA serving and n-gram speculative decoding cost per decode step on the H200
# (Llama-3.1-8B shape, dummy weights; benchmarks/gpu/feature_cost.py), batch 1 and 8.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=420 TAIL=14 run python3 benchmarks/gpu/feature_cost.py $M --batch-sizes 1,8 --output-len 256 --json "$out/feature_cost.json"
