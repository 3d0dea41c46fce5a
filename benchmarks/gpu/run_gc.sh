#!/usr/bin/env bash
# Session 13, call GC: A/B of the 16-row varlen tile for decodes on bench 3 (ABAB in one call, the kernel file swapped
# between runs), then bench 4's peers on bench 3's first 64 ShareGPT-like prompts on the code on main (last run in
# session 7, call AB). The two kernel versions were written before the call, not committed (the device's copy of the
# tree has no git history):
#   git show 69f23de:builtin_platforms/cuda/brigade_cuda/attention/varlen.py > benchmarks/gpu/ab/varlen_before.py
#   git revert --no-commit 4095bde (2b6bc69's change onto main), then cp that varlen.py benchmarks/gpu/ab/varlen_small_tile.py
# Outcome: no gain end to end (docs/benchmarks.md, session 13); main keeps varlen_before.py's kernel.
source "$(dirname "$0")/common.sh"
dst=builtin_platforms/cuda/brigade_cuda/attention/varlen.py
b3() { STEP_TIMEOUT=100 TAIL=2 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like \
    --num-prompts 1000 --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt_$1.json"; }
for round in 1 2; do
  cp benchmarks/gpu/ab/varlen_before.py $dst; b3 before_$round
  cp benchmarks/gpu/ab/varlen_small_tile.py $dst; b3 small_tile_$round
done
STEP_TIMEOUT=330 TAIL=6 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 64 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --hf-batch-size 64 --output-json "$out/peers_sharegpt_64.json"
