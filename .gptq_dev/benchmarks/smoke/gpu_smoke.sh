#!/usr/bin/env bash
# One device call: install wheels + the project with entry points, GPU engine tests, smoke timings.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e builtin_platforms/cuda 2>&1 | tail -3
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -x -q tests/cuda/test_engine_gpu.py 2>&1 | tail -30 | tee "$out/engine_tests.log"
timeout ${SMOKE_TIMEOUT:-240} python3 benchmarks/smoke/gpu_smoke.py benchmarks/configs/llama-3.1-8b 2>&1 | grep -v Warning | tail -30 | tee "$out/smoke.log"
