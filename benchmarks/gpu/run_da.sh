#!/usr/bin/env bash
# Session 10, call DA: the whole GPU suite on main (session 9's last runner refactor, the runtime-LoRA code and
# brigade-gptq's last kernel changes had not run on a GPU), with brigade-gptq installed; then what a mixed
# prefill/decode step costs eagerly against the same step as a CUDA graph (mixed_step_cost.py); then bench 1.
source "$(dirname "$0")/common.sh"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e builtin_quant/gptq 2>&1 | tail -2
STEP_TIMEOUT=360 TAIL=14 run python3 -m pytest -q -p no:warnings --durations=5 tests/cuda
STEP_TIMEOUT=150 TAIL=20 run python3 benchmarks/gpu/mixed_step_cost.py $M --json "$out/mixed_step_cost.json"
lat s10
