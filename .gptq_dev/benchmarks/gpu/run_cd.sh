#!/usr/bin/env bash
# Session 9, call CD: do long-tailed contexts cost the one-split decode at large batches? The decode kernel
# alone on ShareGPT-like contexts against the same total spread evenly (bench_decode_skew.py), then bench 4's
# 128 prompts end to end (profile_steps.py) with BRIGADE_CUDA_DECODE_MIN_SPLITS 1 (the default), 4, 2, 1.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=150 TAIL=4 run env PYTHONPATH=/tmp/site:benchmarks/kernels python3 benchmarks/kernels/bench_decode_skew.py --json "$out/decode_skew.json"
for s in 1 4 2 1; do
    STEP_TIMEOUT=90 TAIL=1 run env BRIGADE_CUDA_DECODE_MIN_SPLITS=$s python3 benchmarks/gpu/profile_steps.py $M --num-prompts 128 --repeat 1 --json "$out/steps_min$s.json"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['passes'][0]; print('elapsed', round(r['elapsed_s'],3), {k: v['mean_ms'] for k, v in r['groups'].items() if 'decode' in k})" "$out/steps_min$s.json"
done
