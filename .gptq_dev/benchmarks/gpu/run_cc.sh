#!/usr/bin/env bash
# Session 9, call CC: where bench 4's 128 ShareGPT-like prompts spend host time (profile_steps.py now splits
# each engine step into device wait and host work, and logs GC pauses and the time to add the requests), then
# benchmarks 2, 3 and 4 (1024/128 peers) on main's code (last run in session 6, before LoRA, speculative
# decoding, the GC freeze and the tuned skinny tiles), with the roofline of this machine.
source "$(dirname "$0")/common.sh"
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
STEP_TIMEOUT=100 TAIL=60 run python3 benchmarks/gpu/profile_steps.py $M --num-prompts 128 --repeat 1 --json "$out/steps_128.json"
STEP_TIMEOUT=120 TAIL=3 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
STEP_TIMEOUT=100 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
STEP_TIMEOUT=200 TAIL=5 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 64 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --output-json "$out/peers_64.json"
