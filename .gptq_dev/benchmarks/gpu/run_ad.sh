#!/usr/bin/env bash
# Session 7: where Brigade's 5.3 s on bench 4's 128 ShareGPT-like prompts goes, step by step (profile_steps.py).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=80 run python3 benchmarks/gpu/profile_steps.py $M --num-prompts 128 --repeat 2 --json "$out/steps_128.json"
