#!/usr/bin/env bash
# Session 12, call FD: the varlen split test (its batch had a 3-token query before a decode, which the test
# helper refuses), then bench 5 at 16 req/s on the split-KV varlen build, counting compiles while serving.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=4 run python3 -m pytest -q -p no:warnings tests/cuda/test_varlen_attention.py
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
STEP_TIMEOUT=120 TAIL=4 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
    --dataset sharegpt-like --num-prompts 500 --request-rate 16 --max-model-len 4096 --output-json "$out/serve_rate_16.json"
echo "compile-watch warnings: $(grep -c 'compiling a new variant' "$out/serve.log")"
grep -E "captured|KV cache" "$out/serve.log" | cut -c1-200 | head -4
kill %1; wait
