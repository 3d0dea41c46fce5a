#!/usr/bin/env bash
# Session 9, call CG: speculative verification steps as CUDA graphs (1 + k tokens a request, padded). Their GPU
# tests and the decode-graph engine tests (DecodeGraphs changed), then feature_cost.py again (call CE measured
# speculation at 13.1 ms per token at batch 1 against 4.0 plain, every verification step eager).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=8 run python3 -m pytest -q -p no:warnings tests/cuda/test_lora_spec_gpu.py tests/cuda/test_engine_gpu.py
STEP_TIMEOUT=300 TAIL=14 run python3 benchmarks/gpu/feature_cost.py $M --batch-sizes 1,8 --output-len 256 --json "$out/feature_cost.json"
