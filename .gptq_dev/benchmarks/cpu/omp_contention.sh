#!/usr/bin/env bash
# Batch-1 decode on the CPU while two busy loops hold both cores (a shared machine), with PyTorch's OpenMP
# defaults, with OMP_WAIT_POLICY=PASSIVE and with OMP_NUM_THREADS=1; then the first two on an idle machine.
# Run from the repository root after scripts/setup.sh. Results: benchmarks/results/cpu/omp_*.json.
set -uo pipefail
M=${MODEL:-$HOME/.cache/brigade/models/SmolLM2-135M-Instruct}
out=benchmarks/results/cpu
lat() {  # $1 name, rest: environment
  local name=$1; shift
  env "$@" .venv/bin/brigade bench latency "$M" --dtype float32 --batch-size 1 --input-len 64 --output-len 64 \
      --num-iters-warmup 1 --num-iters 3 --output-json "$out/omp_$name.json" 2>&1 | grep -A2 "=== latency"
}
busy() { python3 -c "import time; t = time.time()
while time.time() - t < 600: pass" & }
busy; b1=$!; busy; b2=$!
lat loaded_default OMP_WAIT_POLICY=
lat loaded_passive OMP_WAIT_POLICY=PASSIVE
lat loaded_1thread OMP_NUM_THREADS=1
kill $b1 $b2; wait 2>/dev/null
lat idle_default OMP_WAIT_POLICY=
lat idle_passive OMP_WAIT_POLICY=PASSIVE
