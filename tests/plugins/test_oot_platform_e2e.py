"""The example out-of-tree platform runs the real engine end to end on the CPU: installed with pip,
detected through its entry point, it picks its own worker class, block size and attention backend, and
greedy output matches what the model says on the core CPU platform."""

from __future__ import annotations

import json

from plugin_env import PluginVenv

SCRIPT = """
import json, sys
from brigade import LLM, SamplingParams
from brigade.plugins import platform_choice
llm = LLM(sys.argv[1], max_model_len=256, kv_cache_memory_gib=0.05, max_num_seqs=4)
out = llm.generate(["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)
worker = llm.engine.core.executor.worker
print(json.dumps({"platform": platform_choice().name, "worker": type(worker).__name__,
                  "backend": worker.attn_backend.__name__, "block_size": llm.config.cache_config.block_size,
                  "text": out[0].outputs[0].text}))
"""


def test_oot_platform_serves_the_real_model_with_its_worker_and_attention_backend(plugin_venv: PluginVenv,
                                                                                  smollm2_path, tmp_path):
    script = tmp_path / "oot_generate.py"
    script.write_text(SCRIPT)
    result = plugin_venv.run(str(script), str(smollm2_path),
                             env={"BRIGADE_OOT_DEVICE": "1", "BRIGADE_PLUGINS": "oot", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["platform"] == "oot"
    assert (out["worker"], out["backend"], out["block_size"]) == ("OotWorker", "OotAttentionBackend", 32)
    assert out["text"].startswith(" Paris.")
