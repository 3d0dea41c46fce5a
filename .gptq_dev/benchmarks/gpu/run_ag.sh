#!/usr/bin/env bash
# Session 7: the fused sampler's GPU tests (with the distribution test added in call AF) on the kernel as it
# is on main again, after call AF measured the tl.rand4x variant slower (141 against 106 us at batch 128).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda/test_fused_sampler_cuda.py
