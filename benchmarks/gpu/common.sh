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
run() { echo "+ $*"; timeout ${STEP_TIMEOUT:-150} "$@" 2>&1 | grep -v -i "warn\|deprecat" | tail -${TAIL:-25}; }
