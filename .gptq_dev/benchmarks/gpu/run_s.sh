#!/usr/bin/env bash
# Session 5, call S: RMSNorm folded into the qkv / gate_up / LM-head GEMVs and the residual adds into the
# o_proj / down GEMV epilogues (BRIGADE_CUDA_NORM_FOLD, default on), fused sampler on by default, one H2D copy
# per decode-graph step. Tests of what changed, latency A/B, a profile, the bound, then the rest of tests/cuda.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=150 TAIL=6 run python3 -m pytest -q -x -p no:warnings tests/cuda/test_triton_gemm.py \
    tests/cuda/test_llama_triton.py tests/cuda/test_fused_sampler_cuda.py tests/cuda/test_engine_gpu.py
lat fold_1
lat fold_0 BRIGADE_CUDA_NORM_FOLD=0
STEP_TIMEOUT=70 TAIL=40 run python3 benchmarks/gpu/profile_decode.py $M --json "$out/profile_t1.json" --temperature 1.0
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
STEP_TIMEOUT=240 TAIL=6 run python3 -m pytest -q -p no:warnings tests/cuda --deselect tests/cuda/test_triton_gemm.py \
    --deselect tests/cuda/test_llama_triton.py --deselect tests/cuda/test_fused_sampler_cuda.py --deselect tests/cuda/test_engine_gpu.py
