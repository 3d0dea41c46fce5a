#!/usr/bin/env bash
# Prepared in session 6, not run: the whole GPU suite (new since the last full run: compile_watch's GPU test,
# the aligned host-to-device and decode-graph buffers), the roofline and the official latency command.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=330 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
STEP_TIMEOUT=150 TAIL=3 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
