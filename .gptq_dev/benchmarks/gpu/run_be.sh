#!/usr/bin/env bash
# Session 8, final build (skinny tiles tuned in the graph, call BC): bench 5 at 4 and 16 req/s (steps at batch
# 2-16 are most of rate 4's), with brigade_cuda's compile watch reporting any Triton variant compiled while
# serving, then bench 1 for a check at batch 1 (the tiles do not apply there).
source "$(dirname "$0")/common.sh"
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
for rate in 16 4; do
    STEP_TIMEOUT=150 TAIL=6 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
        --dataset sharegpt-like --num-prompts 500 --request-rate $rate --max-model-len 4096 --output-json "$out/serve_rate_$rate.json"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['brigade']; print('ITL max', r['itl_ms']['max'], 'TTFT max', r['ttft_ms']['max'])" "$out/serve_rate_$rate.json"
done
echo "compile-watch warnings: $(grep -c 'compiling a new variant' "$out/serve.log")"; grep 'compiling a new variant' "$out/serve.log" | cut -c1-300 | head -5
kill %1; wait
python3 -m brigade.benchmarks.roofline $M > "$out/roofline.json"; tail -1 "$out/roofline.json"
lat final
