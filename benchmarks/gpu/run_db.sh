#!/usr/bin/env bash
# Session 10, call DB: mixed-step CUDA graphs (MixedGraphs + the varlen attention kernel). Their kernel tests and
# the engine GPU tests (greedy tokens against transformers with mixed graphs replayed, FULL_DECODE_ONLY, all
# steps graphed), LoRA/speculation GPU tests; then mixed_step_cost.py again (eager, ad-hoc graph, and now the
# engine's mixed graph for the same step), then bench 1 (batch-1 decode must not move).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=300 TAIL=30 run python3 -m pytest -q -p no:warnings -x tests/cuda/test_varlen_attention.py tests/cuda/test_engine_gpu.py tests/cuda/test_lora_spec_gpu.py
STEP_TIMEOUT=150 TAIL=20 run python3 benchmarks/gpu/mixed_step_cost.py $M --json "$out/mixed_step_cost.json"
lat s10_mixed
