#!/usr/bin/env bash
# One device call: install the carried wheels, run the CUDA kernel tests, then the attention benchmark.
# Run from the repository root on the GPU machine, with .whl carried (../shared/gpu/fetch-wheels.sh).
# Writes pytest's log and the benchmark JSON under $OUT (or /tmp/out).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:core:builtin_platforms/cuda PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/cuda -q --tb=short -n ${TEST_WORKERS:-8} ${PYTEST_ARGS:-} 2>&1 \
  | tee "$out/pytest.log" | tail -40
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/kernels/bench_attention.py --json "$out/bench_attention.json" \
  ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"
timeout ${OPS_BENCH_TIMEOUT:-60} python3 benchmarks/kernels/bench_ops.py --json "$out/bench_ops.json" 2>&1 | tee "$out/bench_ops.log"
