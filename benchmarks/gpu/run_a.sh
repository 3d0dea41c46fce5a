#!/usr/bin/env bash
# GPU benchmark session A (one device call): decode bound, latency (+HF generate), throughput 1024/128 and
# ShareGPT-like (1000 prompts each), and the HF peers on a 64-prompt subset. Results under $OUT.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 BRIGADE_LOGGING_LEVEL=WARNING
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e builtin_platforms/cuda 2>&1 | tail -3
M=benchmarks/configs/llama-3.1-8b
C="--load-format dummy --dtype bfloat16 --skip-tokenizer-init"
run() { echo "+ brigade $*"; timeout ${STEP_TIMEOUT:-200} brigade "$@" 2>&1 | grep -v -i "warn\|deprecat" | tail -${TAIL:-25}; }
python3 -m brigade.benchmarks.roofline $M | tee "$out/roofline.json"
run bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 3 --hf-peer generate --output-json "$out/latency.json"
run bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
run bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
run bench throughput $M $C --max-model-len 2048 --num-prompts 64 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --output-json "$out/throughput_hf_peers.json"
