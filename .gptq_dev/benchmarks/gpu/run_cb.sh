#!/usr/bin/env bash
# Session 9, call CB (on call CA's machine): the LoRA and speculative-decoding GPU tests again after the test
# helper merged_lora moved the adapter's delta onto the model's device (CA's four errors were that: CPU tensors
# added to CUDA weights in the HF reference, before any Brigade code ran).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=40 run python3 -m pytest -q -p no:warnings -x tests/cuda/test_lora_spec_gpu.py
