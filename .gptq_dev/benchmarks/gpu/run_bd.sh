#!/usr/bin/env bash
# Session 8: the RMSNorm folded into the tensor-core skinny GEMM at 2-16 rows (reverted after this call, see
# benchmarks/kernels/NOTES.md item 12; not runnable as such on main). The whole GPU suite on that build, then an
# A/B end to end on bench 4's 128 ShareGPT-like prompts (profile_steps.py, BRIGADE_CUDA_SKINNY_NORM_FOLD=1 then 0).
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=380 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda
for fold in 1 0; do
    STEP_TIMEOUT=90 TAIL=2 run env BRIGADE_CUDA_SKINNY_NORM_FOLD=$fold python3 benchmarks/gpu/profile_steps.py $M \
        --num-prompts 128 --repeat 1 --json "$out/steps_fold$fold.json"
done
