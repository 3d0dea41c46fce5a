#!/usr/bin/env bash
# Session 12, call FA: the whole GPU suite on main, in two halves (this call: the kernel files; call FB: the engine,
# model, quantized-model, LoRA/speculative and no-compile files), with brigade-awq and brigade-gptq installed.
# Not every GPU test file had run on session 11's final build.
source "$(dirname "$0")/common.sh"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e builtin_quant/gptq -e builtin_quant/awq 2>&1 | tail -2
half=${HALF:-kernels}
if [ "$half" = kernels ]; then
  files="tests/cuda/test_triton_attention.py tests/cuda/test_varlen_attention.py tests/cuda/test_rotary_kv_write.py
         tests/cuda/test_triton_ops.py tests/cuda/test_triton_gemm.py tests/cuda/test_fused_sampler_cuda.py
         tests/cuda/test_host_to_device_cuda.py tests/cuda/test_compile_watch_cuda.py"
else
  files="tests/cuda/test_engine_gpu.py tests/cuda/test_llama_triton.py tests/cuda/test_awq_triton.py
         tests/cuda/test_gptq_triton.py tests/cuda/test_lora_spec_gpu.py tests/cuda/test_no_compile_while_serving.py"
fi
STEP_TIMEOUT=${SUITE_TIMEOUT:-540} TAIL=16 run python3 -m pytest -q -p no:warnings --durations=8 $files
