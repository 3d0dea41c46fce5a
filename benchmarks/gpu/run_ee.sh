#!/usr/bin/env bash
# Session 11, call EE (last): bench 5 on the session's final build (decode graphs ending at hidden states, the
# engine-death watch in the server, MIXED_GRAPH_MAX_CONTEXT 8k) at 16 req/s, 500 prompts; compile-watch warnings
# counted; then the engine process is killed and the server must exit 1 with one error line.
source "$(dirname "$0")/common.sh"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
server=$!
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
STEP_TIMEOUT=120 TAIL=4 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
    --dataset sharegpt-like --num-prompts 500 --request-rate 16 --max-model-len 4096 --output-json "$out/serve_rate_16.json"
python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['brigade']; print('TPOT median', r['tpot_ms']['median'], 'ITL p99', r['itl_ms']['p99'], 'max', r['itl_ms']['max'], 'TTFT median', r['ttft_ms']['median'], 'p99', r['ttft_ms']['p99'], 'req/s', r.get('request_throughput') or r.get('requests_per_s'))" "$out/serve_rate_16.json"
echo "compile-watch warnings: $(grep -c 'compiling a new variant' "$out/serve.log")"
grep -E "captured|KV cache" "$out/serve.log" | cut -c1-200 | head -4
core=$(pgrep -P $server -f spawn_main | head -1)
echo "killing engine core $core"; kill -9 $core
timeout 60 tail --pid=$server -f /dev/null; wait $server; echo "server exit code $?"
tail -2 "$out/serve.log" | cut -c1-300
