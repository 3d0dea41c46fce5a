#!/usr/bin/env bash
# Session 12, call FB: bench 2 (1024 in / 128 out, 1000 prompts) on main, then where its device time goes kernel
# by kernel (profile_kernels.py on 200 of those prompts: device idle share, time per kernel category, the
# projection GEMMs' achieved TFLOP/s), and the copy bandwidth of the machine (roofline).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=3 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 \
    --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
STEP_TIMEOUT=240 TAIL=80 run python3 benchmarks/gpu/profile_kernels.py $M --num-prompts 200 --json "$out/kernels_1024_128.json"
