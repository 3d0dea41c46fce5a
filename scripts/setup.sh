#!/usr/bin/env bash
# setup.sh: make Brigade ready to run and test, from a fresh clone, offline from any model hub.
#
#   1. .venv in the repo root, made with python3 (3.10+; BRIGADE_PYTHON overrides the interpreter);
#   2. torch==$TORCH_VERSION, the CPU wheel pip finds through this machine's find-links. It goes in
#      first and alone, pinned, so that nothing later can pull a multi-GB CUDA build;
#   3. brigade itself, editable, with its test and structured-output extras, plus the local plugin
#      packages listed in LOCAL_PACKAGES (editable, each only if its pyproject.toml exists), installed by uv
#      (itself pip-installed into .venv first; pip does it when uv cannot be installed);
#   4. the real model (scripts/fetch_model.py): SmolLM2-135M-Instruct into
#      $BRIGADE_CACHE_DIR (default ~/.cache/brigade)/models/SmolLM2-135M-Instruct.
#
# Idempotent and fast once done: step 3 is skipped while a stamp of the inputs (this script, every
# pyproject.toml involved, the Python version) is unchanged and every one of those distributions is still
# installed (scripts/missing_packages.py: a `pip uninstall brigade-fp8` since is put back); step 4 is
# skipped once converted.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"
TORCH_VERSION="2.13.0"
PIP_EXTRAS="test,structured"
STAMP="$VENV/.brigade-setup-stamp"

# >>> Editable local packages installed beside the core. Globs are fine; entries without a
# pyproject.toml (or absent) are skipped quietly. Add new distributions here.
LOCAL_PACKAGES=(
    builtin_platforms/cuda
    builtin_platforms/rocm
    builtin_quant/fp8
    builtin_quant/gptq
    builtin_quant/awq
    builtin_connectors/shm
    builtin_connectors/nixl
    plugins/*
)
# <<<

log() { echo "[setup] $*"; }

# pip prints one warning per package for a configured local index folder that does not exist on
# this machine; it is noise, so drop those lines (and only those) from pip's stderr.
pip_install() {
    "$PY" -m pip install --quiet "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# 1. the virtual environment
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    BASE_PY="${BRIGADE_PYTHON:-python3}"
    if ! "$BASE_PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
        echo "[setup] error: $BASE_PY is $("$BASE_PY" --version 2>&1); Brigade needs Python 3.10+" >&2
        exit 1
    fi
    log "creating .venv with $("$BASE_PY" --version 2>&1)"
    rm -rf "$VENV"
    "$BASE_PY" -m venv "$VENV"
fi

# 2. torch, CPU build, pinned, before anything that depends on it
if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
    log "installing torch==$TORCH_VERSION (CPU wheel; a few minutes the first time)"
    REPORT="$(mktemp)"
    pip_install --dry-run --report "$REPORT" "torch==$TORCH_VERSION"
    CHOSEN="$("$PY" -c 'import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    if item["metadata"]["name"].lower() == "torch":
        print(item["metadata"]["version"])' "$REPORT")"
    rm -f "$REPORT"
    if [[ "$CHOSEN" != *+cpu && "${BRIGADE_ALLOW_CUDA_TORCH:-0}" != 1 ]]; then
        echo "[setup] error: pip would install torch '$CHOSEN', not a CPU build (no local CPU wheel for" \
             "this Python?). Install a CPU torch==$TORCH_VERSION into .venv yourself, or set" \
             "BRIGADE_ALLOW_CUDA_TORCH=1 to accept a CUDA build (several GB)." >&2
        exit 1
    fi
    pip_install "torch==$TORCH_VERSION"
fi

# 3. brigade + extras + local plugin packages, skipped while the stamp is current
EDITABLES=(-e ".[$PIP_EXTRAS]")
STAMP_INPUTS=("$ROOT/scripts/setup.sh" "$ROOT/pyproject.toml")
PACKAGE_DIRS=("$ROOT")
for dir in "${LOCAL_PACKAGES[@]}"; do
    if [[ -f "$dir/pyproject.toml" ]]; then
        EDITABLES+=(-e "$dir")
        STAMP_INPUTS+=("$ROOT/$dir/pyproject.toml")
        PACKAGE_DIRS+=("$ROOT/$dir")
    fi
done
WANT_STAMP="$({ "$PY" --version; sha256sum "${STAMP_INPUTS[@]}"; } | sha256sum | cut -d' ' -f1)"
MISSING=""
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
    MISSING="$("$PY" "$ROOT/scripts/missing_packages.py" "${PACKAGE_DIRS[@]}")"
    if [[ -n "$MISSING" ]]; then
        log "not installed in .venv any more: $(echo $MISSING); reinstalling"
    fi
fi
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT_STAMP" || -n "$MISSING" ]]; then
    log "installing brigade[$PIP_EXTRAS] (editable) and $(( ${#EDITABLES[@]} / 2 - 1 )) local package(s)"
    # Keep the torch already installed: a plugin asking for a newer one must fail, not swap it.
    CONSTRAINTS="$(mktemp)"
    "$PY" -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > "$CONSTRAINTS"
    # uv (PyPI `uv`) installs the same set about twice as fast as pip: it downloads and unpacks in parallel, and
    # on a fresh machine this step is mostly downloads. --compile-bytecode writes the .pyc files as pip does: where
    # PYTHONDONTWRITEBYTECODE is set, nothing else would, and every process of the suite would compile
    # transformers from source. pip does it all when uv cannot be had.
    if pip_install uv; then
        "$PY" -m uv pip install --quiet --compile-bytecode --python "$PY" -c "$CONSTRAINTS" "${EDITABLES[@]}"
    else
        pip_install -c "$CONSTRAINTS" "${EDITABLES[@]}"
    fi
    rm -f "$CONSTRAINTS"
    echo "$WANT_STAMP" > "$STAMP"
fi

# 4. the real model
MODEL_DIR="$("$PY" "$ROOT/scripts/fetch_model.py" | tail -n 1)"
log "ready: python $PY, model $MODEL_DIR"
