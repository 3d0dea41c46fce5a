#!/usr/bin/env bash
# Session 13, call GF: after the review fixes (a plugin's logits processor that raises fails only its requests: the
# sampler records the rows, the runner reports them), the sampler, engine and LoRA/speculative GPU test files.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=330 TAIL=10 run python3 -m pytest -q -p no:warnings tests/cuda/test_fused_sampler_cuda.py \
    tests/cuda/test_engine_gpu.py tests/cuda/test_lora_spec_gpu.py
