#!/usr/bin/env bash
# serve.sh: set up (scripts/setup.sh), then serve SmolLM2-135M-Instruct with the OpenAI-compatible
# API on 127.0.0.1:8000. Extra arguments go to `brigade serve` (e.g. --max-model-len 2048).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/setup.sh"

# Nothing comes from a model hub at run time (DESIGN.md); fail fast instead of waiting on the network.
export HF_HUB_OFFLINE=1

HOST=127.0.0.1
PORT=8000
MODEL_NAME=SmolLM2-135M-Instruct
MODEL_DIR="$("$ROOT/.venv/bin/python" "$ROOT/scripts/fetch_model.py" | tail -n 1)"
API_KEY=unused
AUTH=""
# The examples below follow the flags passed on (they come last on the command line, so they win).
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  arg="${args[$i]}"; next="${args[$((i + 1))]:-}"
  case "$arg" in
    --host) SHOW_HOST="$next" ;; --host=*) SHOW_HOST="${arg#*=}" ;;
    --port) PORT="$next" ;; --port=*) PORT="${arg#*=}" ;;
    --api-key) API_KEY="$next" ;; --api-key=*) API_KEY="${arg#*=}" ;;
    --served-model-name) MODEL_NAME="$next" ;; --served-model-name=*) MODEL_NAME="${arg#*=}" ;;
  esac
done
SHOW_HOST="${SHOW_HOST:-$HOST}"
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

exec "$ROOT/.venv/bin/brigade" serve "$MODEL_DIR" --served-model-name "$MODEL_NAME" \
    --host "$HOST" --port "$PORT" "$@"
