#!/usr/bin/env bash
# Session 11, call EF: call EE's bench 5 logged one Triton compile while serving (a one-row _gemv_kernel, BLOCK_K
# 512 -> 256: the LM head's own tile, now outside the decode graphs). The decode-graph capture warms the LM head
# per batch size again; the no-compile test now gives the small model's LM head its own tiles. The test on the
# fix, then with the warm-up deleted (it must fail now), then bench 5 again, counting compile warnings.
source "$(dirname "$0")/common.sh"
STEP_TIMEOUT=120 TAIL=4 run python3 -m pytest -q -p no:warnings tests/cuda/test_no_compile_while_serving.py
brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port 8000 --disable-log-requests > "$out/serve.log" 2>&1 &
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
STEP_TIMEOUT=120 TAIL=4 run brigade bench serve --base-url http://127.0.0.1:8000 --model $M --skip-tokenizer-init \
    --dataset sharegpt-like --num-prompts 500 --request-rate 16 --max-model-len 4096 --output-json "$out/serve_rate_16.json"
echo "compile-watch warnings: $(grep -c 'compiling a new variant' "$out/serve.log")"
grep -E "compiling a new variant" "$out/serve.log" | cut -c1-300 | head -3
kill %1; wait
sed -i '/self.model.compute_logits(self.hidden\[size, self.buckets/d' core/brigade/worker/cuda_graph.py
echo "== without the LM-head warm-up (must fail):"
STEP_TIMEOUT=120 TAIL=4 run python3 -m pytest -q -p no:warnings tests/cuda/test_no_compile_while_serving.py
