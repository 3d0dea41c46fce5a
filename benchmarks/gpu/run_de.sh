#!/usr/bin/env bash
# Session 10, call DE: call DD's GPU suite ran past its 330 s step limit after 471 tests, all passed, no summary;
# these are the last three files of tests/cuda in collection order (the cut fell among them), run again.
source "$(dirname "$0")/common.sh" >/dev/null 2>&1
timeout 170 python3 -m pytest -q -p no:warnings tests/cuda/test_varlen_attention.py tests/cuda/test_triton_ops.py tests/cuda/test_triton_gemm.py 2>&1 | tail -5
