#!/usr/bin/env bash
# Session 11, call EC: brigade-awq's new Triton GEMM (GPU tests, then the kernel benchmark at its own tile and split
# choice), and the long-context threshold of mixed-step graphs (MIXED_GRAPH_MAX_CONTEXT, estimated at 32k):
# a mixed step of 1 or 4 long-context decodes plus a 64-token prefill, eager (split-KV decode) against the
# engine's mixed graph (the varlen kernel, no split-KV), at 4k-64k contexts.
source "$(dirname "$0")/common.sh"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e builtin_quant/awq 2>&1 | tail -2
STEP_TIMEOUT=200 TAIL=10 run python3 -m pytest -q -p no:warnings tests/cuda/test_awq_triton.py
STEP_TIMEOUT=120 TAIL=3 run python3 benchmarks/kernels/bench_awq_gemm.py --json "$out/bench_awq_gemm_sweep.json"
STEP_TIMEOUT=200 TAIL=20 run python3 benchmarks/gpu/mixed_step_cost.py $M --context 4096,16384,32768,65536 \
    --decodes 1,4 --prefills 64 --max-model-len 66000 --gpu-memory-utilization 0.45 --json "$out/mixed_long_context.json"
