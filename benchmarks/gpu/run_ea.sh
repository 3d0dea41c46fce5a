#!/usr/bin/env bash
# Session 11, call EA: decode graphs now end at hidden states (no [size, vocab] logits buffer per graph) and the
# prefill and varlen kernels share one causal key loop (_attend_causal). Kernel and engine GPU tests, the
# roofline and bench 1 (batch-1 TPOT with the LM head launched after the replay), then bench 3 A/B by
# cudagraph_mode (FULL, the default, against FULL_DECODE_ONLY) with the capture log (time and GiB).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda/test_varlen_attention.py tests/cuda/test_triton_attention.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
lat s11_hidden
for mode in FULL FULL_DECODE_ONLY; do
  STEP_TIMEOUT=100 TAIL=8 run env BRIGADE_LOGGING_LEVEL=INFO brigade bench throughput $M $C --max-model-len 4096 \
      --dataset sharegpt-like --num-prompts 1000 --max-num-seqs 512 --max-num-batched-tokens 16384 \
      -cc "{\"cudagraph_mode\": \"$mode\"}" --output-json "$out/throughput_sharegpt_$mode.json" \
      | grep -E "captured|KV cache|blocks|req/s|Throughput|tok/s|^\+ "
done
STEP_TIMEOUT=200 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda/test_engine_gpu.py tests/cuda/test_lora_spec_gpu.py
