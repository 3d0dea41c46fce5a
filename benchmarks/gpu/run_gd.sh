#!/usr/bin/env bash
# Session 13, call GD, on main's code (the 16-row varlen tile dropped after GC's A/B): the GPU test files not run since
# session 12's varlen split-KV change (the model path, LoRA/speculative decoding), then bench 1 with its roofline.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=330 TAIL=10 run python3 -m pytest -q -p no:warnings --durations=5 tests/cuda/test_llama_triton.py tests/cuda/test_lora_spec_gpu.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
STEP_TIMEOUT=90 TAIL=3 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --max-num-seqs 1 --output-json "$out/latency.json"
