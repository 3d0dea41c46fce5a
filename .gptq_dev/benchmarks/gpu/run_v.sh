#!/usr/bin/env bash
# Session 5, call V: is the fused sampler behind the lower 1024/128 throughput of calls T and U (31.0-31.8k
# against 34.3k in session 4)? The same command with it off and on, and the residual-epilogue GEMM tests.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=60 TAIL=2 run python3 -m pytest -q -x -p no:warnings tests/cuda/test_triton_gemm.py -k "residual or rms"
tp() { name=$1; shift; STEP_TIMEOUT=100 TAIL=2 run env "$@" brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 \
    --input-len 1024 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128_$name.json"; }
tp fused_sampler_0 BRIGADE_CUDA_FUSED_SAMPLER=0
tp fused_sampler_1 BRIGADE_CUDA_FUSED_SAMPLER=1
