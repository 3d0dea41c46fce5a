#!/usr/bin/env bash
# Session 9, first call: the whole GPU suite with the new LoRA and speculative-decoding GPU tests
# (tests/cuda/test_lora_spec_gpu.py; never run on a GPU before), then bench 5 at 16 req/s after session 8's two
# fixes for inter-token stalls (the decode split kernels no longer compile a variant per split count; the start-up
# heap is frozen out of the garbage collector), with the compile watch's warnings counted, then bench 1.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=330 TAIL=12 run python3 -m pytest -q -p no:warnings --durations=8 tests/cuda
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
for rate in 16; do
    STEP_TIMEOUT=120 TAIL=6 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
        --dataset sharegpt-like --num-prompts 500 --request-rate $rate --max-model-len 4096 --output-json "$out/serve_rate_$rate.json"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['brigade']; print('ITL max', r['itl_ms']['max'], 'p99', r['itl_ms']['p99'], 'TTFT max', r['ttft_ms']['max'])" "$out/serve_rate_$rate.json"
done
echo "compile-watch warnings: $(grep -c 'compiling a new variant' "$out/serve.log")"; grep 'compiling a new variant' "$out/serve.log" | cut -c1-300 | head -5
kill %1; wait
lat s9
