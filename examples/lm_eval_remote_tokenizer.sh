#!/usr/bin/env bash
# lm_eval_remote_tokenizer.sh: evaluate a `brigade serve` with lm-eval's own client, its tokenizer read from the
# server (lm-eval's `tokenizer_backend=remote`, over GET /tokenizer_info and POST /tokenize).
#
#   1. makes a virtual environment for lm-eval (LM_EVAL_VENV, default $BRIGADE_CACHE_DIR/lm-eval-venv, that is
#      ~/.cache/brigade/lm-eval-venv) if it has no lm_eval yet: torch first, pinned to the build Brigade's own
#      environment has (the CPU one on a CPU machine; lm-eval depends on torch and would otherwise pull a CUDA
#      build of several GB), then lm-eval[api]==$LM_EVAL_VERSION with torch held to that pin;
#   2. starts `brigade serve MODEL --enable-tokenizer-info-endpoint --api-key ...` on 127.0.0.1:$PORT (default
#      8123) and waits for GET /health;
#   3. runs lm-eval's `local-completions` model on the three local tasks in examples/lm_eval_tasks/ (six questions
#      in a jsonl beside them, read by lm-eval's `json` dataset loader: no model or data hub is reached): a
#      `generate_until` task (exact match), a `multiple_choice` task (loglikelihood of each choice, from the
#      prompt's logprobs that /v1/completions echoes for the token ids lm-eval got from /tokenize) and a
#      `loglikelihood_rolling` task (perplexity of each sentence after the BOS token lm-eval tokenizes remotely);
#   4. stops the server (on any exit). Results and the server's log go to OUT (default: a new temporary folder).
#
# Usage: examples/lm_eval_remote_tokenizer.sh [MODEL_DIR]   (default: the set-up's SmolLM2-135M-Instruct)
# Brigade is taken from the active environment (`brigade` on PATH), else from the repository's .venv.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${BRIGADE_CACHE_DIR:-$HOME/.cache/brigade}"
MODEL="${1:-$CACHE/models/SmolLM2-135M-Instruct}"
VENV="${LM_EVAL_VENV:-$CACHE/lm-eval-venv}"
PORT="${PORT:-8123}"
OUT="${OUT:-$(mktemp -d -t brigade-lm-eval-XXXXXX)}"
LM_EVAL_VERSION="0.4.13"
KEY="lm-eval-example"  # the server requires it; lm-eval sends it to the tokenizer routes and to /v1/completions

log() { echo "[lm-eval example] $*"; }
# pip prints one warning per package for a configured local index folder that does not exist on this machine: noise.
pip_install() {
    "$VENV/bin/pip" install --quiet "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
die() { echo "[lm-eval example] error: $*" >&2; exit 1; }

if command -v brigade >/dev/null; then BRIGADE=(brigade)
elif [[ -x "$ROOT/.venv/bin/brigade" ]]; then BRIGADE=("$ROOT/.venv/bin/brigade")
else die "no 'brigade' on PATH and no $ROOT/.venv/bin/brigade: run scripts/setup.sh or activate Brigade's venv"
fi
[[ -f "$MODEL/config.json" ]] || die "no model at $MODEL (no config.json): pass a model folder or run scripts/setup.sh"
BRIGADE_PY="$(dirname "$(command -v "${BRIGADE[0]}")")/python"  # the interpreter of Brigade's environment
[[ -x "$BRIGADE_PY" ]] || BRIGADE_PY=python3
TORCH_VERSION="$("$BRIGADE_PY" -c 'import importlib.metadata as m; print(m.version("torch"))')"

# 1. lm-eval's own environment (lm-eval is not one of Brigade's dependencies)
if [[ ! -x "$VENV/bin/lm_eval" ]]; then
    log "creating $VENV: torch==$TORCH_VERSION, then lm-eval[api]==$LM_EVAL_VERSION (a few minutes)"
    python3 -m venv "$VENV"
    pip_install "torch==$TORCH_VERSION"
    CONSTRAINTS="$VENV/torch-constraint.txt"
    echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
    pip_install -c "$CONSTRAINTS" "lm-eval[api]==$LM_EVAL_VERSION"
fi

# 2. the server
NAME="$(basename "$MODEL")"
log "serving $NAME on 127.0.0.1:$PORT (log: $OUT/server.log)"
"${BRIGADE[@]}" serve "$MODEL" --host 127.0.0.1 --port "$PORT" --max-model-len 1024 --max-num-seqs 4 \
    --enable-tokenizer-info-endpoint --api-key "$KEY" > "$OUT/server.log" 2>&1 &
SERVER_PID=$!
stop_server() { kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true; }
trap stop_server EXIT
for _ in $(seq 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 20 "$OUT/server.log" >&2; die "brigade serve exited"; }
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || die "brigade serve not healthy after 300 s (see $OUT/server.log)"

# 3. the evaluation; the dataset's data_files are relative to the working directory
cd "$ROOT/examples/lm_eval_tasks"
MODEL_ARGS="model=$NAME,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=remote"
MODEL_ARGS+=",auth_token=$KEY,max_length=1024"
OPENAI_API_KEY="$KEY" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$VENV/bin/lm_eval" \
    --model local-completions --model_args "$MODEL_ARGS" \
    --tasks capitals_gen,capitals_mc,capitals_ppl --include_path . \
    --output_path "$OUT" --log_samples
log "results and per-question samples in $OUT"
