#!/usr/bin/env bash
# Session 10, call DC: bench 5 (serving, ShareGPT-like prompts, Poisson arrivals) with mixed-step CUDA graphs
# (cudagraph_mode FULL, the default) against FULL_DECODE_ONLY (mixed steps eager, as before this session), at
# 16 req/s (500 prompts) and 4 req/s (100 prompts), one server per mode; compile-watch warnings counted.
source "$(dirname "$0")/common.sh"
# Call DB's failure (an overlapped step that sampled nothing) is fixed; the graphs now end with hidden states at
# token counts every 8/16 (a 257-token step no longer runs padded to 512): engine GPU tests and the step costs again.
STEP_TIMEOUT=200 TAIL=8 run python3 -m pytest -q -p no:warnings tests/cuda/test_engine_gpu.py tests/cuda/test_lora_spec_gpu.py
STEP_TIMEOUT=150 TAIL=16 run python3 benchmarks/gpu/mixed_step_cost.py $M --json "$out/mixed_step_cost.json"
for mode in FULL FULL_DECODE_ONLY; do
    brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests \
        --compilation-config "{\"cudagraph_mode\": \"$mode\"}" > "$out/serve_$mode.log" 2>&1 &
    for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
    for spec in 16:500 4:100; do
        rate=${spec%:*}; n=${spec#*:}
        STEP_TIMEOUT=120 TAIL=4 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
            --dataset sharegpt-like --num-prompts $n --request-rate $rate --max-model-len 4096 \
            --output-json "$out/serve_${mode}_rate_$rate.json"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['brigade']; print(sys.argv[2], 'TPOT median', r['tpot_ms']['median'], 'ITL p99', r['itl_ms']['p99'], 'max', r['itl_ms']['max'], 'TTFT median', r['ttft_ms']['median'], 'p99', r['ttft_ms']['p99'])" "$out/serve_${mode}_rate_$rate.json" "$mode@$rate"
    done
    echo "$mode compile-watch warnings: $(grep -c 'compiling a new variant' "$out/serve_$mode.log")"
    grep -E "captured|compiling a new variant" "$out/serve_$mode.log" | cut -c1-250 | head -6
    kill %1; wait
done
