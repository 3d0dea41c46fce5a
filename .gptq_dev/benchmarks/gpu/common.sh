# Sourced by the GPU session scripts (run_*.sh) on the device machine, from the repository root:
# installs the carried wheels (.whl/) and Brigade with the brigade-cuda plugin as editable installs (so the
# entry points exist), and defines $out (results, $OUT on the device tool), $M and $C (the Llama-3.1-8B shape
# with dummy weights) and run (echo a command, run it under a timeout, keep the tail of its output).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 BRIGADE_LOGGING_LEVEL=WARNING
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e builtin_platforms/cuda 2>&1 | tail -3
M=benchmarks/configs/llama-3.1-8b
C="--load-format dummy --dtype bfloat16 --skip-tokenizer-init"
# Python's own warnings (torch, transformers) are filtered out; Brigade's WARNING log lines (the compile
# watch's "compiling a new variant ... while serving") are kept.
run() { echo "+ $*"; timeout ${STEP_TIMEOUT:-150} "$@" 2>&1 | grep -v -E "Warning: |warnings\.warn|[Dd]eprecat" | tail -${TAIL:-25}; }
# lat NAME [VAR=VALUE ...]: the batch-1 latency benchmark (3 iterations, batch-1 graphs only) under that
# environment, results in $out/latency_NAME.json.
lat() { local name=$1; shift; STEP_TIMEOUT=${STEP_TIMEOUT:-70} TAIL=2 run env "$@" brigade bench latency $M $C \
    --max-model-len 2048 --batch-size 1 --input-len 128 --output-len 256 --num-iters-warmup 1 --num-iters 3 \
    --max-num-seqs 1 --output-json "$out/latency_$name.json"; }
