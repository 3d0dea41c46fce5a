#!/usr/bin/env bash
# Session 8: the tensor-core skinny GEMM's tiles tuned inside a captured step with PDL (tune_skinny_graph.py, 8
# rows), not alone as bench_gemm.py times them; then the GEMM tests with the tuned table, and an A/B end to end on
# bench 4's 128 ShareGPT-like prompts (profile_steps.py: tuned table, then the previous one).
source "$(dirname "$0")/common.sh"
T=builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json
cp $T /tmp/previous_tiles.json
STEP_TIMEOUT=240 TAIL=12 run env PYTHONPATH=/tmp/site:benchmarks/kernels python3 benchmarks/kernels/tune_skinny_graph.py \
    --rows 8 --json "$out/tune_skinny_graph_m8.json" --write-tiles $T
cp $T "$out/"
STEP_TIMEOUT=120 TAIL=3 run python3 -m pytest -q -p no:warnings tests/cuda/test_triton_gemm.py
for tiles in tuned previous; do
    f=$T; [ $tiles = previous ] && f=/tmp/previous_tiles.json
    STEP_TIMEOUT=100 TAIL=3 run env BRIGADE_CUDA_GEMM_TILES=$f python3 benchmarks/gpu/profile_steps.py $M --num-prompts 128 \
        --repeat 1 --json "$out/steps_$tiles.json"
done
