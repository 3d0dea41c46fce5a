#!/usr/bin/env bash
# Session 7: the fused sampler's random path with one Philox call per four logits (tl.rand4x). The whole GPU
# suite (with the new distribution test across quarters and segments), then the decode profile at batch 8
# and 128, temperature 1.0: _segment_best_kernel took 8 and 106 us a step in call AE.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=300 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda
STEP_TIMEOUT=200 TAIL=60 run env BRIGADE_CUDA_PDL=0 python3 benchmarks/gpu/profile_decode.py $M --batch-sizes 8,128 \
    --prompt-len 256 --output-len 32 --temperature 1.0 --json "$out/decode_profile_batches.json"
