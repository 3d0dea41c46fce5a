#!/usr/bin/env bash
# Session 13, call GB (same machine as GA, Triton cache warm): the varlen and engine GPU tests again on the 16-row
# varlen tile (GA's step limit cut them at 92%, all passing so far), then bench 3 (mixed-step graphs) on it.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=300 TAIL=10 run python3 -m pytest -q -p no:warnings --durations=5 tests/cuda/test_varlen_attention.py tests/cuda/test_engine_gpu.py
STEP_TIMEOUT=100 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
