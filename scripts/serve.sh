#!/usr/bin/env bash
# serve.sh: set up (scripts/setup.sh), then serve SmolLM2-135M-Instruct with the OpenAI-compatible
# API on 127.0.0.1:8000 (loopback only; plain `brigade serve` listens on 0.0.0.0). Extra arguments go to
# `brigade serve` (e.g. --max-model-len 2048, or --host 0.0.0.0 to listen on every interface); another model
# is given as the first argument or with --model (./scripts/serve.sh --model /models/Qwen2.5-0.5B-Instruct).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/setup.sh"

# Nothing comes from a model hub at run time (README.md, docs/setup.md); fail fast instead of waiting on the network.
export HF_HUB_OFFLINE=1

HOST=127.0.0.1
PORT=8000
MODEL_NAME=""
MODEL_DIR=""
MODEL_ARGS=()  # how the model reaches `brigade serve`: MODEL (the default, or the user's first argument) or --model
API_KEY=unused
AUTH=""
DEFAULT_FLAGS=()  # --host and --port, each unless the user gave it (brigade serve then sees each flag once)
GIVEN_HOST=0
GIVEN_PORT=0
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then  # ./scripts/serve.sh MODEL [flags], as `brigade serve MODEL`
  MODEL_DIR="$1"; MODEL_ARGS=("$1"); shift
fi
# The examples below follow the flags passed on (they come last on the command line, so they win).
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  arg="${args[$i]}"; next="${args[$((i + 1))]:-}"
  case "$arg" in
    --host) SHOW_HOST="$next"; GIVEN_HOST=1 ;; --host=*) SHOW_HOST="${arg#*=}"; GIVEN_HOST=1 ;;
    --port) PORT="$next"; GIVEN_PORT=1 ;; --port=*) PORT="${arg#*=}"; GIVEN_PORT=1 ;;
    --api-key) API_KEY="$next" ;; --api-key=*) API_KEY="${arg#*=}" ;;
    --served-model-name) MODEL_NAME="$next" ;; --served-model-name=*) MODEL_NAME="${arg#*=}" ;;
    --model) MODEL_DIR="$next" ;; --model=*) MODEL_DIR="${arg#*=}" ;;
  esac
done
if [ -z "$MODEL_DIR" ]; then  # the real model that setup.sh built
  MODEL_DIR="$("$ROOT/.venv/bin/python" "$ROOT/scripts/fetch_model.py" | tail -n 1)"
  MODEL_ARGS=("$MODEL_DIR")
fi
# brigade serve's default name is the model folder's name
MODEL_NAME="${MODEL_NAME:-$(basename "${MODEL_DIR%/}")}"
SHOW_HOST="${SHOW_HOST:-$HOST}"
(( GIVEN_HOST )) || DEFAULT_FLAGS+=(--host "$HOST")
(( GIVEN_PORT )) || DEFAULT_FLAGS+=(--port "$PORT")
[ "$SHOW_HOST" = "0.0.0.0" ] && SHOW_HOST=127.0.0.1
[ "$API_KEY" != unused ] && AUTH=" -H 'Authorization: Bearer $API_KEY'"

cat <<MSG
[serve] starting brigade serve $MODEL_DIR on http://$SHOW_HOST:$PORT (Ctrl-C stops it)
[serve] once it is up, query it with curl:
  curl http://$SHOW_HOST:$PORT/v1/chat/completions -H 'Content-Type: application/json'$AUTH \\
    -d '{"model": "$MODEL_NAME", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32}'
  curl http://$SHOW_HOST:$PORT/v1/completions -H 'Content-Type: application/json'$AUTH \\
    -d '{"model": "$MODEL_NAME", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'
[serve] or with the openai client (.venv/bin/python):
  from openai import OpenAI
  client = OpenAI(base_url="http://$SHOW_HOST:$PORT/v1", api_key="$API_KEY")
  reply = client.chat.completions.create(model="$MODEL_NAME", max_tokens=32,
      messages=[{"role": "user", "content": "What is the capital of France?"}])
  print(reply.choices[0].message.content)
MSG

COMMAND=(brigade serve ${MODEL_ARGS[@]+"${MODEL_ARGS[@]}"} ${DEFAULT_FLAGS[@]+"${DEFAULT_FLAGS[@]}"} "$@")
echo "[serve] ${COMMAND[*]}"
exec "$ROOT/.venv/bin/${COMMAND[0]}" "${COMMAND[@]:1}"
