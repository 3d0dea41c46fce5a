#!/usr/bin/env bash
# Session 12, call FC: split-KV inside the varlen kernel (mixed-step graphs now take any context). The attention
# and engine GPU tests on it, then call EC's long-context mixed step again (eager, ad-hoc graph, the engine's mixed
# graph; 1 or 4 decodes at 4k-64k context plus a 64-token prefill), then bench 3 (its mixed steps replay the
# graphs with the plan kernel and the extra programs: must not regress from 65.8 req/s, call EA).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=240 TAIL=8 run python3 -m pytest -q -p no:warnings tests/cuda/test_varlen_attention.py \
    tests/cuda/test_triton_attention.py tests/cuda/test_engine_gpu.py tests/cuda/test_no_compile_while_serving.py
STEP_TIMEOUT=200 TAIL=20 run python3 benchmarks/gpu/mixed_step_cost.py $M --context 4096,16384,32768,65536 \
    --decodes 1,4 --prefills 64 --max-model-len 66000 --gpu-memory-utilization 0.45 --json "$out/mixed_long_context.json"
STEP_TIMEOUT=90 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
