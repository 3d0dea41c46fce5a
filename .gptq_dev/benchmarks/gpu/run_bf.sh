#!/usr/bin/env bash
# Session 8: call BE's one compile while serving (_decode_split_kernel, stride_mid_h = the split count reaching 16:
# a 0.29 s stall, ITL max 291 ms) fixed by not specializing the split buffers' strides. The new compile-watch test
# alone in a fresh process (nothing compiled before it), then the attention tests.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=100 TAIL=4 run python3 -m pytest -q -p no:warnings tests/cuda/test_triton_attention.py -k split_counts_share
STEP_TIMEOUT=150 TAIL=4 run python3 -m pytest -q -p no:warnings tests/cuda/test_triton_attention.py tests/cuda/test_rotary_kv_write.py
