#!/usr/bin/env bash
# Session 7: where a decode step goes at batch 8, 32 and 128 (profile_steps in call AD: 4.8, 5.7 and 8.1 ms
# a step, against 4.1 ms at batch 1), kernel by kernel with PDL off so that per-kernel times mean something.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=300 TAIL=120 run env BRIGADE_CUDA_PDL=0 python3 benchmarks/gpu/profile_decode.py $M --batch-sizes 8,32,128 \
    --prompt-len 256 --output-len 32 --temperature 1.0 --json "$out/decode_profile_batches.json"
