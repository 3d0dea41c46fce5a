#!/usr/bin/env bash
# Session 6: where do the serve runs' inter-token stalls come from (run_x, rate 16: ITL max 1.76 s, TTFT max
# 1.82 s; rate 4: 0.55 s)? The server runs with compile_watch/ on PYTHONPATH, which prints every Triton
# variant loaded or compiled with its time; those after the server reported healthy are listed at the end.
# The skinny GEMM's row count is do_not_specialize from this run on, and (second run) the packed input
# copy aligns every array to 64 bytes (unaligned views compiled new prefill/decode/rotary variants).
source "$(dirname "$0")/common.sh"
[ -n "${WITH_TESTS:-}" ] && STEP_TIMEOUT=60 TAIL=2 run python3 -m pytest -q -p no:warnings tests/cuda/test_host_to_device_cuda.py
PYTHONPATH=$PWD/benchmarks/gpu/compile_watch:$PYTHONPATH brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 \
    --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
ready=$(date +%s.%N); echo "ready at $ready; variants before: $(grep -c TRITON_COMPILE "$out/serve.log")"
for rate in 16 inf; do
  STEP_TIMEOUT=150 TAIL=8 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
      --dataset sharegpt-like --num-prompts 500 --request-rate $rate --max-model-len 4096 --output-json "$out/serve_rate_$rate.json"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['brigade']; print('ITL max', r['itl_ms']['max'], 'TTFT max', r['ttft_ms']['max'])" "$out/serve_rate_$rate.json"
  echo "variants after ready so far:"; awk -v r=$ready '/TRITON_COMPILE/{split($2,a,"="); if (a[2] > r) print}' "$out/serve.log" | cut -c1-400
done
kill %1; wait
grep TRITON_COMPILE "$out/serve.log" | awk '{print $4}' | cut -d'[' -f1 | sort | uniq -c
