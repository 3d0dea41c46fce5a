#!/usr/bin/env bash
# Session 9, call CF: call CE measured n-gram speculation at 13.1 ms per token at batch 1 (plain 4.0 ms) with
# 1.26 tokens per verification step, i.e. ~16.5 ms a verification step. Where it goes: cProfile of a run with
# drafts, against the same run without speculation with graphs and with enforce_eager.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=300 TAIL=90 run python3 benchmarks/gpu/profile_spec.py $M --json "$out/profile_spec.json"
