#!/usr/bin/env bash
# Session 11, call ED: decode graphs end at hidden states, so the LM head runs outside them; the capture now
# warms it per batch size. The new test (no Triton compile while serving, in a fresh process) on the fix, then
# with the warm-up line deleted (it must fail), the engine GPU tests with MIXED_GRAPH_MAX_CONTEXT at 8k, and
# the mixed-step cost at 8k and 12k contexts around the new threshold.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda/test_no_compile_while_serving.py tests/cuda/test_engine_gpu.py
STEP_TIMEOUT=150 TAIL=20 run python3 benchmarks/gpu/mixed_step_cost.py $M --context 8192,12288 \
    --decodes 1,4 --prefills 64 --max-model-len 16384 --gpu-memory-utilization 0.45 --json "$out/mixed_8k_12k.json"
sed -i '/self.model.compute_logits(self.hidden\[size, self.buckets/d' core/brigade/worker/cuda_graph.py
grep -c "compute_logits(self.hidden" core/brigade/worker/cuda_graph.py
echo "== without the LM-head warm-up (must fail):"
STEP_TIMEOUT=150 TAIL=4 run python3 -m pytest -q -p no:warnings tests/cuda/test_no_compile_while_serving.py
