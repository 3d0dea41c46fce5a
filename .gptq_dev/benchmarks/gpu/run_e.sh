#!/usr/bin/env bash
# GPU session E (one device call): GPU tests (skinny GEMM incl. a PDL graph chain, engine greedy vs
# transformers), then batch-1 latency with PDL (weight-prefetching GEMM) on and off, and HF generate once.
# The weight prefetch was a working-tree experiment, never committed (docs/benchmarks.md, "tried, dropped"):
# on main this script times the committed GEMM, so its figures are not those of session2/latency_e_*.json.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=15 run python3 -m pytest -q -x tests/cuda/test_triton_gemm.py tests/cuda/test_engine_gpu.py tests/cuda/test_triton_ops.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -3 "$out/roofline.json"
STEP_TIMEOUT=240 TAIL=7 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 3 --hf-peer generate --output-json "$out/latency.json"
TAIL=6 run env BRIGADE_CUDA_PDL=0 brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --output-json "$out/latency_nopdl.json"
