#!/usr/bin/env bash
# Prepared in session 5, run in session 6: serve at 16, 4 and unbounded req/s (do the mid-run compile stalls of calls U
# and P, ITL max 1.7-2.0 s, go away with the warm-ups and do_not_specialize?), then the HF peers on a subset of
# bench 3's ShareGPT-like prompts (the issue allows "same model and prompts, a subset").
# Session 6: first the short-context graph bucket, now on by default (run_w: 3.94 against 4.04 ms), through its
# unit tests and the official latency command with the HF peer.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=3 run python3 -m pytest -q -p no:warnings tests/cuda/test_triton_attention.py -k "short or split"
STEP_TIMEOUT=150 TAIL=3 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 5 --hf-peer generate --output-json "$out/latency.json"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
for rate in 16 4 inf; do
  STEP_TIMEOUT=150 TAIL=12 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
      --dataset sharegpt-like --num-prompts 500 --request-rate $rate --max-model-len 4096 --output-json "$out/serve_rate_$rate.json"
done
kill %1; wait
STEP_TIMEOUT=200 TAIL=6 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --hf-batch-size 64 --output-json "$out/peers_sharegpt_128.json"
