#!/usr/bin/env bash
# The headline benchmark suite on one GPU (docs/benchmarks.md), on the Llama-3.1-8B shape with dummy weights:
#   limits          copy bandwidth, batch-1 TPOT bound, dense matmul peak (benchmarks/device_limits.py)
#   latency         bench 1: batch 1, 128 in / 256 out, TPOT against the bound; HF `generate` in the same run
#   throughput      bench 2: 1000 x (1024 in, 128 out)
#   sharegpt        bench 3: 1000 ShareGPT-like prompts
#   sharegpt-penalty  bench 3 with 10% of the requests at repetition_penalty 1.1 (target: within 5% of bench 3)
#   peers           bench 4: HF `generate` and `generate_batch` on 64 x (1024 in, 128 out), same prompts
#   peers-sharegpt  bench 4: the same peers on bench 3's first 64 ShareGPT-like prompts
#   serve           bench 5: `brigade bench serve` against `brigade serve --skip-tokenizer-init` at 16, 4, inf req/s
# FP8 (brigade-fp8, online --quantization fp8 on the same shape; docs/quantization.md "GPU figures"):
#   fp8-latency     FP8 bench 1: batch 1, 128 in / 256 out
#   fp8-throughput  FP8 bench 2: 1000 x (1024 in, 128 out)
#   fp8-sharegpt    FP8 bench 3: bench 3's prompts with FP8 weights and --kv-cache-dtype fp8
#   fp8-batch64     FP8 bench 4: batch 64, 128 in / 256 out, and the same in bf16 beside it
# Mixture of experts (benchmarks/configs/mixtral-8x7b and qwen3-30b-a3b, dummy bf16 weights; docs/moe.md):
#   moe-latency     MoE benches 1 and 2: batch 1, 128 in / 256 out, Mixtral-8x7B and Qwen3-30B-A3B
#   moe-throughput  MoE bench 3: Mixtral-8x7B, 1000 x (1024 in, 128 out)
#   moe-sharegpt    MoE bench 4: Qwen3-30B-A3B, bench 3's prompts
#   moe-kernel      MoE bench 5: the fused MoE kernel against the reference path and a dense loop (bench_fused_moe.py)
# Attention shapes (benchmarks/configs/gemma-2-9b, gpt-oss-20b, gemma-3-12b[-all-full], mistral-7b; dummy bf16):
#   shape-gemma2    s1: Gemma-2-9B, batch 1, 128 in / 256 out (TPOT against its bandwidth bound)
#   shape-gpt-oss   s2: gpt-oss-20b in bf16, batch 1, 128 in / 256 out (TPOT against the active-weight bound)
#   shape-kv-capacity  s3: 8192-token sequences the KV cache holds, Gemma-3-12B against every layer full
#                   (benchmarks/kv_capacity.py)
#   shape-long-prompt  s4: Mistral-7B, one 32640-token prompt, 128 out (TTFT, TPOT), and the KV bytes its
#                   windowed layers hold (kv_capacity.py at 32768 tokens)
# Every result goes into one folder per run, then benchmarks/suite_summary.py writes summary.json and summary.md
# there and prints the table. Run from the repository root of a GPU machine set up as benchmarks/gpu_setup.sh says.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: benchmarks/run_gpu_suite.sh [options]
  --part 1|2|3|4|5|all  part 1: limits latency throughput sharegpt sharegpt-penalty peers (~7 min on an H200);
                     part 2: peers-sharegpt serve (~7 min); part 3: limits and the FP8 benches (~5 min);
                     part 4: limits and the MoE benches (~7 min); part 5 (or shapes): limits and the
                     attention-shape benches (~8 min); all: every part (~34 min, over one 10-minute device
                     call: run the parts as separate calls). Default: all.
  --bench LIST       run only these, comma-separated: limits latency throughput sharegpt sharegpt-penalty peers
                     peers-sharegpt serve fp8-latency fp8-throughput fp8-sharegpt fp8-batch64 moe-latency
                     moe-throughput moe-sharegpt moe-kernel shape-gemma2 shape-gpt-oss shape-kv-capacity
                     shape-long-prompt, or their numbers 0 1 2 3 3p 4 4s 5 f1 f2 f3 f4 m1 (and m2: both
                     latencies) m3 m4 m5 s1 s2 s3 s4 (overrides --part)
  --quick            fewer prompts and iterations everywhere: a smoke test of the whole suite (~8 min)
  --run-name NAME    the result folder's name (default: the UTC start time, e.g. 2026-12-01T1405Z); give part 2
                     part 1's name to fill the same folder
  --out DIR          the result folder itself (default: [$OUT/]benchmarks/results/<gpu>/<run name>)
  --baseline DIR     also compare every headline figure with this earlier result folder
  --label TEXT       a note stored in run_<part>.json (give the commit: the device's copy of the tree may carry
                     a stale git HEAD, so the script records none)
  --no-setup         skip benchmarks/gpu_setup.sh (wheels and editable installs already done on this machine)
  --dry-run          print the commands, run nothing
  -h, --help         this help
Environment: PORT (bench 5's server port, default 8000); SERVE_RATES (bench 5's RATE:PROMPTS list, default
"16:500 4:100 inf:500"); LATENCY_HF_PEER (none skips bench 1's HF peer); <NAME>_TIMEOUT overrides a step's time limit in
seconds, e.g. LATENCY_TIMEOUT=300 (names upper-cased, '-' as '_').
EOF
}

part=all benches="" quick=0 run_name="" out_dir="" baseline="" label="" setup=1 dry=0
while [ $# -gt 0 ]; do
  case $1 in
    --part) part=${2:?--part needs 1, 2, 3, 4, 5 or all}; shift 2 ;;
    --bench) benches=${2:?--bench needs a list}; shift 2 ;;
    --quick) quick=1; shift ;;
    --run-name) run_name=${2:?}; shift 2 ;;
    --out) out_dir=${2:?}; shift 2 ;;
    --baseline) baseline=${2:?}; shift 2 ;;
    --label) label=${2:?}; shift 2 ;;
    --no-setup) setup=0; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done

FP8_BENCHES="fp8-latency fp8-throughput fp8-sharegpt fp8-batch64"
MOE_BENCHES="moe-latency moe-throughput moe-sharegpt moe-kernel"
SHAPE_BENCHES="shape-gemma2 shape-gpt-oss shape-kv-capacity shape-long-prompt"
ALL="limits latency throughput sharegpt sharegpt-penalty peers peers-sharegpt serve $FP8_BENCHES $MOE_BENCHES"
ALL="$ALL $SHAPE_BENCHES"
case $part in
  1) selected="limits latency throughput sharegpt sharegpt-penalty peers" ;;
  2) selected="peers-sharegpt serve" ;;
  3) selected="limits $FP8_BENCHES" ;;
  4) selected="limits $MOE_BENCHES" ;;
  5|shapes) part=5 selected="limits $SHAPE_BENCHES" ;;
  all) selected=$ALL ;;
  *) echo "--part must be 1, 2, 3, 4, 5 (shapes) or all" >&2; exit 2 ;;
esac
if [ -n "$benches" ]; then
  selected="" part=custom
  for b in ${benches//,/ }; do
    case $b in
      0) b=limits ;; 1) b=latency ;; 2) b=throughput ;; 3) b=sharegpt ;; 3p) b=sharegpt-penalty ;; 4) b=peers ;;
      4s) b=peers-sharegpt ;;
      5) b=serve ;;
      f1) b=fp8-latency ;; f2) b=fp8-throughput ;; f3) b=fp8-sharegpt ;; f4) b=fp8-batch64 ;;
      m1|m2) b=moe-latency ;; m3) b=moe-throughput ;; m4) b=moe-sharegpt ;; m5) b=moe-kernel ;;
      s1) b=shape-gemma2 ;; s2) b=shape-gpt-oss ;; s3) b=shape-kv-capacity ;; s4) b=shape-long-prompt ;;
    esac
    case " $ALL " in *" $b "*) ;; *) echo "unknown benchmark: $b" >&2; exit 2 ;; esac
    wanted="${wanted:-} $b"
  done
  for b in $ALL; do case " $wanted " in *" $b "*) selected="$selected $b" ;; esac; done   # in the suite's order
fi
tag=$(case $part in 1|2|3|4|5) echo "part$part" ;; *) echo "$part" ;; esac)   # part1 ... part4, all or custom

cd "$(dirname "$0")/.." || exit 1
if [ "$setup" = 1 ]; then
  # brigade-fp8 for the FP8 benches (the bf16 ones never load it: no --quantization)
  GPU_SETUP_EXTRA="${GPU_SETUP_EXTRA:-} builtin_quant/fp8" GPU_SETUP_DRY_RUN=$dry source benchmarks/gpu_setup.sh \
    || { echo "set-up failed" >&2; exit 1; }
else
  M=benchmarks/configs/llama-3.1-8b C="--load-format dummy --dtype bfloat16 --skip-tokenizer-init"
  export PYTHONUNBUFFERED=1 BRIGADE_LOGGING_LEVEL=${BRIGADE_LOGGING_LEVEL:-WARNING}
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | awk '{print tolower($NF)}')
run_name=${run_name:-$(date -u +%Y-%m-%dT%H%MZ)}
out_dir=${out_dir:-${OUT:+$OUT/}benchmarks/results/${gpu:-gpu}/$run_name}
[ "$dry" = 1 ] || mkdir -p "$out_dir/logs" || exit 1
echo "benchmarks: $selected"
echo "results:    $out_dir"

# Sizes: full, or --quick.
if [ "$quick" = 1 ]; then
  LAT_ITERS=2 N2=100 N3=100 N4=4 SERVE="16:100 4:20 inf:100" MOE_TOKENS=1,64 LONG_IN=8064 LONG_ITERS=1
else
  LAT_ITERS=5 N2=1000 N3=1000 N4=64 SERVE=${SERVE_RATES:-"16:500 4:100 inf:500"} MOE_TOKENS=1,8,64,512,4096
  LONG_IN=32640 LONG_ITERS=3
fi
MIXTRAL=benchmarks/configs/mixtral-8x7b QWEN3_MOE=benchmarks/configs/qwen3-30b-a3b
GEMMA2=benchmarks/configs/gemma-2-9b GPT_OSS=benchmarks/configs/gpt-oss-20b MISTRAL=benchmarks/configs/mistral-7b
GEMMA3=benchmarks/configs/gemma-3-12b
PORT=${PORT:-8000}
steps_file="$out_dir/steps_$tag.tsv"   # one file per part, so that two parts merge into one folder
[ "$dry" = 1 ] || : > "$steps_file"

# step NAME DEFAULT_TIMEOUT CMD...: run CMD under a time limit, its whole output in logs/NAME.log, its tail on
# the terminal, and one line "NAME  exit status  seconds" in steps_<part>.tsv. A failing step does not stop
# the suite.
step() {
  local name=$1 limit=$2; shift 2
  local var; var=$(echo "${name}_TIMEOUT" | tr 'a-z-' 'A-Z_')
  limit=${!var:-$limit}
  echo "+ [$name, ${limit}s] $*"
  [ "$dry" = 1 ] && return 0
  local start=$SECONDS rc
  timeout "$limit" "$@" > "$out_dir/logs/$name.log" 2>&1
  rc=$?
  grep -v -E "Warning: |warnings\.warn|[Dd]eprecat" "$out_dir/logs/$name.log" | tail -"${TAIL:-8}"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$steps_file"
  [ "$rc" = 0 ] || echo "!! $name: exit status $rc (124: over its ${limit}s limit)"
  return 0
}

bench_limits() {
  step limits 120 python3 benchmarks/device_limits.py $M --json "$out_dir/limits.json"
}

bench_latency() {
  step latency 240 brigade bench latency $M $C --max-model-len 2048 --max-num-seqs 1 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters $LAT_ITERS --hf-peer "${LATENCY_HF_PEER:-generate}" \
    --output-json "$out_dir/latency.json"
}

bench_throughput() {
  step throughput 180 brigade bench throughput $M $C --max-model-len 2048 --num-prompts $N2 --input-len 1024 \
    --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out_dir/throughput_1024_128.json"
}

bench_sharegpt() {
  step sharegpt 150 brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like --num-prompts $N3 \
    --max-num-seqs 512 --max-num-batched-tokens 16384 --output-json "$out_dir/throughput_sharegpt.json"
}

bench_sharegpt_penalty() {
  step sharegpt-penalty 150 brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like \
    --num-prompts $N3 --max-num-seqs 512 --max-num-batched-tokens 16384 --repetition-penalty-fraction 0.1 \
    --repetition-penalty 1.1 --output-json "$out_dir/throughput_sharegpt_penalty.json"
}

bench_peers() {
  step peers 240 brigade bench throughput $M $C --max-model-len 2048 --num-prompts $N4 --input-len 1024 \
    --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both \
    --output-json "$out_dir/peers_1024_128.json"
}

bench_peers_sharegpt() {
  step peers-sharegpt 360 brigade bench throughput $M $C --max-model-len 4096 --dataset sharegpt-like \
    --num-prompts $N4 --max-num-seqs 512 --max-num-batched-tokens 16384 --hf-peer both --hf-batch-size $N4 \
    --output-json "$out_dir/peers_sharegpt.json"
}

bench_fp8_latency() {
  step fp8-latency 180 brigade bench latency $M $C --quantization fp8 --max-model-len 2048 --max-num-seqs 1 \
    --batch-size 1 --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters $LAT_ITERS \
    --output-json "$out_dir/fp8_latency.json"
}

bench_fp8_throughput() {
  step fp8-throughput 180 brigade bench throughput $M $C --quantization fp8 --max-model-len 2048 \
    --num-prompts $N2 --input-len 1024 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 \
    --output-json "$out_dir/fp8_throughput_1024_128.json"
}

bench_fp8_sharegpt() {
  step fp8-sharegpt 150 brigade bench throughput $M $C --quantization fp8 --kv-cache-dtype fp8 \
    --max-model-len 4096 --dataset sharegpt-like --num-prompts $N3 --max-num-seqs 512 \
    --max-num-batched-tokens 16384 --output-json "$out_dir/fp8_throughput_sharegpt.json"
}

bench_fp8_batch64() {
  local quant name
  for quant in "" fp8; do
    name=${quant:+fp8-}batch64
    step "$name" 150 brigade bench latency $M $C ${quant:+--quantization $quant} --max-model-len 2048 \
      --max-num-seqs 64 --batch-size 64 --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 \
      --output-json "$out_dir/${quant:+fp8_}latency_b64.json"
  done
}

bench_moe_latency() {
  local model
  for model in $MIXTRAL $QWEN3_MOE; do
    step "moe-latency-${model##*/}" 180 brigade bench latency $model $C --max-model-len 2048 --max-num-seqs 1 \
      --batch-size 1 --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 \
      --output-json "$out_dir/moe_latency_${model##*/}.json"
  done
}

bench_moe_throughput() {
  step moe-throughput 240 brigade bench throughput $MIXTRAL $C --max-model-len 2048 --num-prompts $N2 \
    --input-len 1024 --output-len 128 --max-num-seqs 512 --max-num-batched-tokens 16384 \
    --output-json "$out_dir/moe_throughput_1024_128.json"
}

bench_moe_sharegpt() {
  step moe-sharegpt 150 brigade bench throughput $QWEN3_MOE $C --max-model-len 4096 --dataset sharegpt-like \
    --num-prompts $N3 --max-num-seqs 512 --max-num-batched-tokens 16384 \
    --output-json "$out_dir/moe_throughput_sharegpt.json"
}

bench_moe_kernel() {
  step moe-kernel 240 env PYTHONPATH="benchmarks/kernels${PYTHONPATH:+:$PYTHONPATH}" \
    python3 benchmarks/kernels/bench_fused_moe.py --tokens $MOE_TOKENS --json "$out_dir/fused_moe.json"
}

# s1 and s2: batch-1 decode on a shape, the bound from its config (suite_summary.py: weights plus KV read).
bench_shape_latency() {
  local name=$1 model=$2
  step "$name" 240 brigade bench latency $model $C --max-model-len 2048 --max-num-seqs 1 --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters $LAT_ITERS \
    --output-json "$out_dir/shape_latency_${model##*/}.json"
}

bench_shape_gemma2() { bench_shape_latency shape-gemma2 $GEMMA2; }

bench_shape_gpt_oss() { bench_shape_latency shape-gpt-oss $GPT_OSS; }

# s3: one engine per model (kv_capacity.py starts each in its own process), same memory share; a 2048-token step
# budget, under which a 1024-token window's group holds fewer blocks than the whole 8192 (at 8192 it holds all).
bench_shape_kv_capacity() {
  step shape-kv-capacity 360 python3 benchmarks/kv_capacity.py $GEMMA3 --against $GEMMA3-all-full --seq-len 8192 \
    --json "$out_dir/shape_kv_capacity.json" $C --max-model-len 8192 --max-num-batched-tokens 2048 \
    --gpu-memory-utilization 0.9 --enforce-eager
}

# s4: a 32k prompt (max_position_embeddings is 32768: 32640 in + 128 out), TTFT and TPOT from the latency bench;
# then the KV cache config of the same model at 32768 tokens, for the bytes its windowed layers hold.
bench_shape_long_prompt() {
  step shape-long-prompt 300 brigade bench latency $MISTRAL $C --max-model-len 32768 --max-num-seqs 1 \
    --batch-size 1 --input-len $LONG_IN --output-len 128 --num-iters-warmup 1 --num-iters $LONG_ITERS \
    --output-json "$out_dir/shape_long_prompt_mistral-7b.json"
  step shape-long-prompt-kv 180 python3 benchmarks/kv_capacity.py $MISTRAL --seq-len 32768 \
    --json "$out_dir/shape_kv_mistral-7b.json" $C --max-model-len 32768 --gpu-memory-utilization 0.9 --enforce-eager
}

healthy() {
  python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    "http://127.0.0.1:$PORT/health" >/dev/null 2>&1
}

# stop_server PID: SIGTERM to the server's process group, SIGKILL after 30 s.
stop_server() {
  local pid=$1 i
  kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null
  for i in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

# Bench 5: one server (its own process group, stopped by that group's id), then each rate in turn.
bench_serve() {
  local serve=(brigade serve $M $C --max-model-len 4096 --max-num-seqs 512 --port $PORT --disable-log-requests)
  echo "+ [serve] ${serve[*]} > serve.log &"
  local pid=""
  if [ "$dry" = 0 ]; then
    local leader=(); command -v setsid >/dev/null && leader=(setsid)
    "${leader[@]}" "${serve[@]}" > "$out_dir/serve.log" 2>&1 &
    pid=$!
    local waited=0 limit=${SERVE_START_TIMEOUT:-240}
    until healthy; do
      if ! kill -0 "$pid" 2>/dev/null || [ "$waited" -ge "$limit" ]; then
        echo "!! serve: the server did not come up in ${waited}s; its log:"; tail -20 "$out_dir/serve.log"
        printf 'serve-start\t1\t%s\n' "$waited" >> "$steps_file"
        stop_server "$pid"
        return 0
      fi
      sleep 2; waited=$((waited + 2))
    done
    echo "server ready after ${waited}s"
    printf 'serve-start\t0\t%s\n' "$waited" >> "$steps_file"
  fi
  local item rate n
  for item in $SERVE; do
    rate=${item%%:*} n=${item#*:}
    step "serve-rate-$rate" 150 brigade bench serve --base-url "http://127.0.0.1:$PORT" --model $M \
      --skip-tokenizer-init --dataset sharegpt-like --num-prompts "$n" --request-rate "$rate" --max-model-len 4096 \
      --output-json "$out_dir/serve_rate_$rate.json"
  done
  if [ -n "$pid" ]; then
    stop_server "$pid"
    echo "compiles while serving (compile watch): $(grep -c 'compiling a new variant' "$out_dir/serve.log")"
  fi
}

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
[ "$dry" = 1 ] || nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader \
  > "$out_dir/logs/nvidia-smi_$tag.txt" 2>&1
for b in $selected; do
  "bench_${b//-/_}"
done
[ "$dry" = 1 ] && exit 0

python3 - "$out_dir" "$run_name" "$started" "$tag" "$quick" "$label" "$selected" <<'PY'
import json, sys, time
from pathlib import Path
out, name, started, tag, quick, label, selected = sys.argv[1:]
lines = (Path(out) / f"steps_{tag}.tsv").read_text().splitlines()
steps = [{"step": s, "exit_status": int(rc), "seconds": int(sec)} for s, rc, sec in (l.split("\t") for l in lines if l)]
gpu = (Path(out) / "logs" / f"nvidia-smi_{tag}.txt").read_text().strip()
record = {"run_name": name, "part": tag, "quick": quick == "1", "benchmarks": selected.split(), "started": started,
          "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "label": label or None,
          "gpu": gpu, "steps": steps}
(Path(out) / f"run_{tag}.json").write_text(json.dumps(record, indent=1) + "\n")
PY
echo
echo "steps (name, exit status, seconds):"; column -t "$steps_file" 2>/dev/null || cat "$steps_file"
echo
python3 benchmarks/suite_summary.py "$out_dir" ${baseline:+--baseline "$baseline"}
# The device tool returns a few files from shallow paths only: with $OUT set, the whole folder also goes back as one
# archive beside it, $OUT/<run name>-<part>.tgz (unpack it into benchmarks/results/<gpu>/).
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/$run_name-$tag.tgz" -C "$(dirname "$out_dir")" "$(basename "$out_dir")" \
    && echo "archive: $OUT/$run_name-$tag.tgz"
fi
