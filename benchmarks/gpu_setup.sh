# Sourced (not run) from the repository root on a GPU machine whose image has torch, triton and transformers but no
# network: installs the wheels carried in .whl/ into /tmp/site (on PYTHONPATH) and Brigade with the brigade-cuda
# platform as editable installs, so that the `brigade` command and the plugin entry points exist. Then defines
#   M  the Llama-3.1-8B shape (config.json only; weights are dummy)
#   C  the engine flags every headline benchmark shares
# Extra local packages to install editable: GPU_SETUP_EXTRA="builtin_quant/gptq builtin_quant/awq".
# GPU_SETUP_DRY_RUN=1 only prints the install commands.
# Returns non-zero (without exiting the caller's shell) when an install fails.

gpu_setup() {
  local dry=${GPU_SETUP_DRY_RUN:-0} extra=() pkg
  for pkg in ${GPU_SETUP_EXTRA:-}; do extra+=(-e "$pkg"); done
  local wheels=(python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site)
  local project=(python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e builtin_platforms/cuda
                 "${extra[@]}")
  if [ "$dry" = 1 ]; then
    echo "+ ${wheels[*]} .whl/*.whl"
    echo "+ export PYTHONPATH=/tmp/site"
    echo "+ ${project[*]}"
    return 0
  fi
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "gpu_setup: no wheels in .whl/ (fill it on the development machine, then carry it along)" >&2
    return 1
  fi
  "${wheels[@]}" .whl/*.whl || return 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  "${project[@]}" 2>&1 | tail -3
  return "${PIPESTATUS[0]}"
}

export PYTHONUNBUFFERED=1 BRIGADE_LOGGING_LEVEL=${BRIGADE_LOGGING_LEVEL:-WARNING}
M=benchmarks/configs/llama-3.1-8b
C="--load-format dummy --dtype bfloat16 --skip-tokenizer-init"
gpu_setup
