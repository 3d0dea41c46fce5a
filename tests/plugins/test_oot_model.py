"""The example out-of-tree model package (plugins/oot_model): installed with pip, it adds OlmoForCausalLM through
the register_models hook, with no core edit, and serves it with greedy tokens identical to transformers."""

from __future__ import annotations

import json

import pytest
import torch

from plugin_env import PluginVenv, record

SCRIPT = """
import json, sys
from brigade import LLM, SamplingParams
llm = LLM(sys.argv[1], dtype="float32", max_model_len=256, kv_cache_memory_gib=0.02, max_num_seqs=4,
          skip_tokenizer_init=True)
prompts = [{"prompt_token_ids": p} for p in json.loads(sys.argv[2])]
outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=int(sys.argv[3])), use_tqdm=False)
print(json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


@pytest.fixture(scope="module")
def tiny_olmo(tmp_path_factory):
    from transformers import OlmoConfig, OlmoForCausalLM

    torch.manual_seed(0)
    config = OlmoConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, clip_qkv=0.5,
                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=None)
    model = OlmoForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny-olmo")
    model.save_pretrained(path)
    return path, model


def test_the_model_plugin_registers_olmo(plugin_venv: PluginVenv):
    row = record(plugin_venv.plugins_json(), "oot_model")
    assert row["status"] == "loaded" and "register_models" in row["hooks"]


def test_the_model_plugin_serves_olmo_as_transformers_does(plugin_venv: PluginVenv, tiny_olmo, tmp_path):
    path, hf_model = tiny_olmo
    prompts = [[1, 5, 9, 17, 33, 2, 7], [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]
    max_tokens = 24
    script = tmp_path / "olmo_generate.py"
    script.write_text(SCRIPT)
    result = plugin_venv.run(str(script), str(path), json.dumps(prompts), str(max_tokens),
                             env={"BRIGADE_PLUGINS": "oot_model", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                    min_new_tokens=max_tokens)
        assert tokens == ref[0, len(prompt):].tolist()


def test_a_capability_the_model_lacks_is_one_line(plugin_venv: PluginVenv, tiny_olmo):
    path, _ = tiny_olmo
    code = ("import sys\nfrom brigade import LLM\nfrom brigade.config import ConfigError\n"
            "try:\n    LLM(sys.argv[1], tensor_parallel_size=2, skip_tokenizer_init=True)\n"
            "except ConfigError as e:\n    print(e)\n")
    result = plugin_venv.run("-c", code, str(path), env={"BRIGADE_PLUGINS": "oot_model", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == ("OlmoForCausalLM does not shard its layers, so it cannot run "
                                                      "with tensor parallelism (-tp 2); serve it with -tp 1")
