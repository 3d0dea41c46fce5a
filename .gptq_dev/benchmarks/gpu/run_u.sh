#!/usr/bin/env bash
# Session 5, call U (final): residual adds left to the next norm's fused add-and-normalize kernel where no
# epilogue kernel takes the batch (prefill-sized), instead of cuBLAS addmm (call T: throughput 31.8k tok/s
# against 34.3k). GPU tests of the model paths, batch-1 latency, both throughput benchmarks, serve at 16 req/s.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=150 TAIL=3 run python3 -m pytest -q -x -p no:warnings tests/cuda/test_llama_triton.py \
    tests/cuda/test_triton_gemm.py tests/cuda/test_engine_gpu.py
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
STEP_TIMEOUT=70 TAIL=2 run brigade bench latency $M $C --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters-warmup 1 --num-iters 3 --max-num-seqs 1 --output-json "$out/latency.json"
STEP_TIMEOUT=120 TAIL=3 run brigade bench throughput $M $C --max-model-len 2048 --num-prompts 1000 --input-len 1024 --output-len 128 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_1024_128.json"
STEP_TIMEOUT=100 TAIL=3 run brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts 1000 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out/throughput_sharegpt.json"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
STEP_TIMEOUT=100 TAIL=12 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
    --dataset sharegpt-like --num-prompts 500 --request-rate 16 --max-model-len 4096 --output-json "$out/serve_rate_16.json"
kill %1; wait
