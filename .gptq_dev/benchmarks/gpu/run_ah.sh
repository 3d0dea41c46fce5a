#!/usr/bin/env bash
# Session 7, final build: bench 5 at 16 req/s (the issue's target rate) after the serving-layer changes of
# this session (CORS middleware, the pre-tokenizing length check, checks moved before streams start), with
# brigade_cuda's compile watch reporting any Triton variant compiled while serving.
source "$(dirname "$0")/common.sh"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
STEP_TIMEOUT=120 TAIL=8 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
    --dataset sharegpt-like --num-prompts 500 --request-rate 16 --max-model-len 4096 --output-json "$out/serve_rate_16.json"
python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['brigade']; print('ITL max', r['itl_ms']['max'], 'TTFT max', r['ttft_ms']['max'])" "$out/serve_rate_16.json"
echo "compile-watch warnings: $(grep -c 'compiling a new variant' "$out/serve.log")"; grep 'compiling a new variant' "$out/serve.log" | cut -c1-300 | head -5
kill %1; wait
