#!/usr/bin/env bash
# Prepared in session 6, not run: the whole GPU suite (new since the last full run: compile_watch's GPU test,
# the aligned host-to-device and decode-graph buffers), the roofline, the batch-1 A/B of the short-context
# graph buckets (default 512 against 256,512: contexts 128-256 then take 4 splits) and the official latency.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=330 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
lat default
lat buckets_256_512 BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN=256,512
STEP_TIMEOUT=150 TAIL=3 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
