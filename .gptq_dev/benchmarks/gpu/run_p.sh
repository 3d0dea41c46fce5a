#!/usr/bin/env bash
# Session 4, call P: bench 5 (`brigade bench serve` against `brigade serve` on loopback) at 16 and unbounded
# req/s, 500 ShareGPT-like prompts each (the 4 req/s rate of run_b.sh did not fit the device time left).
source "$(dirname "$0")/common.sh"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
for rate in 16 inf; do
  STEP_TIMEOUT=120 TAIL=12 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
      --dataset sharegpt-like --num-prompts 500 --request-rate $rate --max-model-len 4096 --output-json "$out/serve_rate_$rate.json"
done
kill %1; wait
