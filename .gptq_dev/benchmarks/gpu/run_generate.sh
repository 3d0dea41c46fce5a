#!/usr/bin/env bash
# Issue 3's H200 check: `brigade generate` on a small random-weight Llama through the brigade-cuda platform,
# and `brigade plugins` showing the active platform and why. Carries .cache/tiny-tok (SmolLM2's tokenizer).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e builtin_platforms/cuda 2>&1 | tail -3
python3 - <<'PY'
import shutil, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=49152, max_position_embeddings=2048, bos_token_id=1,
                  eos_token_id=2, tie_word_embeddings=True)
LlamaForCausalLM(cfg).save_pretrained("/tmp/tiny-llama")
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(f".cache/tiny-tok/{f}", "/tmp/tiny-llama/")
PY
BRIGADE_ENDPOINT_PLUGINS= brigade plugins 2>&1 | tail -12
brigade generate "The capital of France is" /tmp/tiny-llama --max-tokens 16 --json 2>&1 | grep -v -i "deprecat" | tail -6
