#!/usr/bin/env bash
# Session 4, call N: the new defaults (decode-rope on, log-space exponential race with the two-pass argmax
# in the sampler, decode-graph inputs staged straight into the graph buffers) timed with the official
# latency command (default flags, HF generate peer), an A/B against BRIGADE_CUDA_DECODE_ROPE=0, the decode
# profile with graph replay time, then all GPU tests.
source "$(dirname "$0")/common.sh"
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
STEP_TIMEOUT=200 TAIL=4 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
lat() { name=$1; shift; STEP_TIMEOUT=90 TAIL=2 run env "$@" brigade bench latency $M $C --max-model-len 2048 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 --max-num-seqs 1 --output-json "$out/latency_$name.json"; }
lat decode_rope_0 BRIGADE_CUDA_DECODE_ROPE=0
lat default_s1
STEP_TIMEOUT=90 TAIL=14 run python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile.json"
python3 -c "import json; d = json.load(open('$out/profile.json')); print('graph replay us', d['graph_replay_us'])"
STEP_TIMEOUT=280 TAIL=8 run python3 -m pytest -q -p no:warnings tests/cuda
