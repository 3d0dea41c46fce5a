#!/usr/bin/env bash
# GPU benchmark session B (one device call): HF peers on a 64-prompt subset, then `brigade bench serve`
# against one `brigade serve` at 4, 16 and unbounded req/s (500 ShareGPT-like prompts each).
source "$(dirname "$0")/common.sh"
: run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 64 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --output-json "$out/throughput_hf_peers.json"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests \
    > "$out/serve.log" 2>&1 &
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
for rate in 16 inf 4; do
  STEP_TIMEOUT=${STEP_TIMEOUT:-200} run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init --dataset sharegpt-like \
      --num-prompts 500 --request-rate $rate --max-model-len 4096 --output-json "$out/serve_rate_$rate.json"
done
kill %1; wait
