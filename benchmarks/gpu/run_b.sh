#!/usr/bin/env bash
# GPU benchmark session B (one device call): HF peers on a 64-prompt subset, then `brigade bench serve`
# against one `brigade serve` at 4, 16 and unbounded req/s (500 ShareGPT-like prompts each).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 BRIGADE_LOGGING_LEVEL=WARNING
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e builtin_platforms/cuda 2>&1 | tail -3
M=benchmarks/configs/llama-3.1-8b
C="--load-format dummy --dtype bfloat16 --skip-tokenizer-init"
run() { echo "+ brigade $*"; timeout ${STEP_TIMEOUT:-200} brigade "$@" 2>&1 | grep -v -i "warn\|deprecat" | tail -${TAIL:-25}; }
: run bench throughput $M $C --max-model-len 2048 --num-prompts 64 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --output-json "$out/throughput_hf_peers.json"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests \
    > "$out/serve.log" 2>&1 &
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
for rate in 16 inf 4; do
  run bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init --dataset sharegpt-like \
      --num-prompts 500 --request-rate $rate --max-model-len 4096 --output-json "$out/serve_rate_$rate.json"
done
kill %1; wait
