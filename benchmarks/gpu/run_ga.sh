#!/usr/bin/env bash
# Session 13, call GA: brigade-gptq/brigade-awq GPU tests on session 12's final code (the SPLIT_K_MIN_K rule and the
# shared store epilogue had only run under the interpreter), then the 16-row varlen tile for decodes (2b6bc69,
# reverted in session 12 unverified, re-applied): the varlen kernel's GPU tests and the engine GPU tests.
source "$(dirname "$0")/common.sh"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e builtin_quant/gptq -e builtin_quant/awq 2>&1 | tail -2
STEP_TIMEOUT=260 TAIL=8 run python3 -m pytest -q -p no:warnings --durations=5 tests/cuda/test_gptq_triton.py tests/cuda/test_awq_triton.py
STEP_TIMEOUT=280 TAIL=10 run python3 -m pytest -q -p no:warnings --durations=5 tests/cuda/test_varlen_attention.py tests/cuda/test_engine_gpu.py
