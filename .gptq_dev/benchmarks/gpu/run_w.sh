#!/usr/bin/env bash
# Prepared in session 5, not run (its device time ran out). First the whole GPU suite: after the last GPU call
# the decode/prefill kernels took do_not_specialize arguments and 32 merge lanes, the fused sampler fixed
# constexprs, and the model runner start-up warm-ups. Then the batch-1 A/B of the short-context decode graph
# (BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN=512: 8 splits instead of 32) and the official latency command.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=300 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
lat default
lat short_graph_512 BRIGADE_CUDA_DECODE_SHORT_GRAPH_LEN=512
STEP_TIMEOUT=150 TAIL=3 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
