#!/usr/bin/env bash
# Session 13, call GE: the varlen plan now lives in the step's AttentionMetadata.backend_state (no module-level
# cache keyed by metadata identity): the varlen, engine and no-compile GPU test files on that code, then bench 3.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=420 TAIL=10 run python3 -m pytest -q -p no:warnings --durations=5 tests/cuda/test_varlen_attention.py \
    tests/cuda/test_engine_gpu.py tests/cuda/test_no_compile_while_serving.py
STEP_TIMEOUT=80 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
