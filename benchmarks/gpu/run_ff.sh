#!/usr/bin/env bash
# Session 12, call FF: could eager mixed steps attend through the varlen kernel too (one launch, GQA-packed tiles,
# split-KV) instead of split-KV decode + merge + the per-head prefill kernel? Both on the same steps.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=200 TAIL=12 run python3 benchmarks/kernels/bench_varlen_vs_split.py --json "$out/varlen_vs_split.json"
