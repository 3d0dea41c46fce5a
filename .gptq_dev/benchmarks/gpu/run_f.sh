#!/usr/bin/env bash
# GPU session F (one device call): skinny-GEMM tests, then batch-1 latency A/B/C alternated twice:
# PDL with the GEMM's weight prefetch (default), PDL without prefetch, no PDL.
# The prefetch variant (BRIGADE_CUDA_GEMM_PREFETCH) was a working-tree experiment, removed before commit
# after these runs (docs/benchmarks.md, "tried, dropped"): on main the first two variants run the same code.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=4 run python3 -m pytest -q -x tests/cuda/test_triton_gemm.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -3 "$out/roofline.json"
lat() { TAIL=2 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 \
    --output-len 256 --num-iters-warmup 1 --num-iters 5 --output-json "$out/latency_${round}_${name}.json"; }
for round in 1 2; do
  name=pdl_prefetch lat BRIGADE_CUDA_PDL=1
  name=pdl_noprefetch lat BRIGADE_CUDA_GEMM_PREFETCH=0
  name=nopdl lat BRIGADE_CUDA_PDL=0
done
python3 -m brigade.benchmarks.roofline $M > "$out/roofline_after.json"; tail -3 "$out/roofline_after.json"
