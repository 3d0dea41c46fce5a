#!/usr/bin/env bash
# Session 10, call DD (last): the whole GPU suite on main with mixed-step graphs (brigade-gptq installed), then
# bench 3 (ShareGPT-like throughput: its small steps now replay mixed graphs), the step costs (eager, ad-hoc
# graph, the engine's mixed graph; with the capture times logged) and bench 1.
source "$(dirname "$0")/common.sh"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e builtin_quant/gptq 2>&1 | tail -2
STEP_TIMEOUT=330 TAIL=12 run python3 -m pytest -q -p no:warnings --durations=3 tests/cuda
STEP_TIMEOUT=90 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
STEP_TIMEOUT=120 TAIL=40 run env BRIGADE_LOGGING_LEVEL=INFO python3 benchmarks/gpu/mixed_step_cost.py $M --decodes 0,8,64 --prefills 16,100,257 --json "$out/mixed_step_cost.json"
lat s10_final
