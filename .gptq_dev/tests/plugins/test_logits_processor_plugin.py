"""A logits-processor plugin, really pip-installed in a fresh venv, runs inside the engine's sampler.

The fixture package (fixtures/ban_tokens) registers a processor through ``register_logits_processors``;
the model runner hands every registered processor to its Sampler, requests reach it through
``SamplingParams.extra_args``, and its ``validate`` refuses bad arguments before anything runs.
"""

from __future__ import annotations

import json

from plugin_env import FIXTURES, make_venv

SCRIPT = """
import json, sys
from brigade import LLM, SamplingParams
from brigade.sampling_params import InvalidParamError

llm = LLM(sys.argv[1], dtype="float32", max_model_len=64)
paris = llm.get_tokenizer().encode(" Paris")[0]

def first_token(**kwargs):
    params = SamplingParams(temperature=0, max_tokens=2, **kwargs)
    return llm.generate("The capital of France is", params, use_tqdm=False)[0].outputs[0].token_ids[0]

try:
    first_token(extra_args={"ban_token_ids": [-1]})
    refused = None
except InvalidParamError as exc:
    refused = exc.param
print(json.dumps({"paris": paris, "plain": first_token(), "banned": first_token(extra_args={"ban_token_ids": [paris]}),
                  "refused": refused}))
"""


def test_installed_logits_processor_plugin_changes_sampling(tmp_path_factory, smollm2_path):
    venv = make_venv(tmp_path_factory.mktemp("logits-processor-venv"))
    venv.install(FIXTURES / "ban_tokens")
    row = next(p for p in venv.plugins_json()["plugins"] if p["name"] == "ban_tokens")
    assert row["status"] == "loaded" and row["hooks"] == ["register_logits_processors"]
    result = venv.run("-c", SCRIPT, str(smollm2_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["plain"] == out["paris"]  # greedy " Paris" without the plugin's argument
    assert out["banned"] != out["paris"]  # the plugin's mask removed it
    assert out["refused"] == "vllm_xargs"  # validate() ran in the front end
