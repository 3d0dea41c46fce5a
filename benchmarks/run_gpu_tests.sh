#!/usr/bin/env bash
# The GPU test suite (tests/cuda) on a GPU machine set up as benchmarks/gpu_setup.sh says, with brigade-gptq,
# brigade-awq and brigade-fp8 installed for their kernel tests, on GPU_TEST_WORKERS pytest-xdist workers (default 8,
# a test file per worker at a time). The engine tests give their KV pool a fixed size (one file profiles the device
# and takes half of it), so files run side by side; the whole suite takes about 6 minutes on an H200, inside one
# device call. Two parts are there for re-running a half:
#   part 1: the kernel files (attention, rotary + KV write, fused ops, GEMMs, sampler, input copies, compile watch,
#           the Triton Llama, overlapped sampling)
#   part 2: every other file of tests/cuda (engine, model, quantized GEMMs, MoE, LoRA/speculative decoding, serving)
# pytest's output goes to ${OUT:-/tmp}/gpu-tests/<part>.log and a JUnit XML beside it.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: benchmarks/run_gpu_tests.sh [--part 1|2|all] [--no-setup] [--dry-run] [-- PYTEST_ARGS...]
  --part 1|2|all   which half of tests/cuda (default: all, in one pytest run)
  --no-setup       skip benchmarks/gpu_setup.sh (already done on this machine)
  --dry-run        print the commands, run nothing
Environment: TESTS_TIMEOUT (seconds per run, default 480), GPU_TEST_WORKERS (default 8).
EOF
}

part=all setup=1 dry=0 extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --part) part=${2:?--part needs 1, 2 or all}; shift 2 ;;
    --no-setup) setup=0; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done
case $part in 1|2|all) ;; *) echo "--part must be 1, 2 or all" >&2; exit 2 ;; esac

cd "$(dirname "$0")/.." || exit 1
if [ "$setup" = 1 ]; then
  GPU_SETUP_EXTRA="builtin_quant/gptq builtin_quant/awq builtin_quant/fp8" GPU_SETUP_DRY_RUN=$dry source benchmarks/gpu_setup.sh \
    || { echo "set-up failed" >&2; exit 1; }
fi

KERNEL_FILES="test_triton_attention.py test_varlen_attention.py test_rotary_kv_write.py test_triton_ops.py
              test_triton_gemm.py test_fused_sampler_cuda.py test_host_to_device_cuda.py test_compile_watch_cuda.py
              test_llama_triton.py test_overlapped_sampling_cuda.py"
files_of_part() {
  local f name
  for f in tests/cuda/test_*.py; do
    name=${f##*/}
    case " $(echo $KERNEL_FILES) " in
      *" $name "*) [ "$1" = 1 ] && echo "$f" ;;
      *) [ "$1" = 2 ] && echo "$f" ;;
    esac
  done
}

out=${OUT:-/tmp}/gpu-tests
[ "$dry" = 1 ] || mkdir -p "$out"
if [ "$part" = all ]; then files="tests/cuda"; else files=$(files_of_part "$part" | tr '\n' ' '); fi
# Two compute threads per worker process: eight workers' OpenMP pools would fight over the host's cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
cmd=(python3 -m pytest -q -p no:warnings -p no:cacheprovider --durations=15 -rfE --junitxml "$out/part-$part.xml"
     -n "${GPU_TEST_WORKERS:-8}" --dist loadfile $files "${extra[@]}")
echo "+ [part $part, ${TESTS_TIMEOUT:-480}s] ${cmd[*]}"
[ "$dry" = 1 ] && exit 0
timeout "${TESTS_TIMEOUT:-480}" "${cmd[@]}" > "$out/part-$part.log" 2>&1
rc=$?
tail -40 "$out/part-$part.log"
[ "$rc" = 0 ] || echo "!! part $part: exit status $rc (124: over its time limit)"
exit $rc
