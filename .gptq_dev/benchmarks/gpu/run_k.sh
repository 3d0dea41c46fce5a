#!/usr/bin/env bash
# GPU session 3, call K: every GPU test on the final code (no -x: all of them run), then the ShareGPT-like
# throughput with the fused rotary+KV write off and on (call J measured 55.7 req/s against session 2's 62.2).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=260 TAIL=12 run python3 -m pytest -q tests/cuda
for fused in 0 1; do
  TAIL=3 run env BRIGADE_CUDA_FUSED_ROPE_KV=$fused brigade bench throughput $M $C --max-model-len 4096 \
      --dataset sharegpt-like --num-prompts 1000 --max-num-seqs 512 --max-num-batched-tokens 16384 \
      --output-json "$out/throughput_sharegpt_fused_rope_kv_$fused.json"
done
