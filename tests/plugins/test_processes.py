"""Plugins in every process: workers started by fork and by spawn see the general and platform plugins,
and the API-only groups stay out of engine processes (docs/plugins.md, "Entry-point groups")."""

from __future__ import annotations

import json

import pytest

from plugin_env import PluginVenv, run_script

WORKER_SCRIPT = '''
import json, multiprocessing as mp, os, sys


def worker(queue):
    from brigade.plugins import current_platform, load_plugins, process_plugin_manager, registries
    inherited = sorted(process_plugin_manager().loaded_groups())
    load_plugins("engine")  # what every worker entry point does; idempotent when inherited
    queue.put({"pid": os.getpid(), "inherited_groups": inherited,
               "kv_connectors": registries.kv_connectors.names(),
               "attention_backends": registries.attention_backends.names(),
               "platform": current_platform().name,
               "probe_registrations": [r.source.plugin for r in registries.models.entries()].count("probe")})


if __name__ == "__main__":
    from brigade.plugins import load_plugins
    load_plugins("engine")  # the parent (EngineCore) has loaded before starting workers
    ctx = mp.get_context(sys.argv[1])
    queue = ctx.Queue()
    proc = ctx.Process(target=worker, args=(queue,))
    proc.start()
    result = queue.get(timeout=120)
    proc.join(timeout=60)
    result["exitcode"] = proc.exitcode
    result["parent_pid"] = os.getpid()
    print(json.dumps(result))
'''


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_started_by_fork_and_spawn_see_general_and_platform_plugins(plugin_venv: PluginVenv,
                                                                            tmp_path, method):
    script = tmp_path / "workers.py"
    script.write_text(WORKER_SCRIPT)
    result = plugin_venv.run(str(script), method, env={"BRIGADE_OOT_DEVICE": "1", "BRIGADE_PLUGINS": "probe,oot"})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["exitcode"] == 0 and out["pid"] != out["parent_pid"]
    assert out["kv_connectors"] == ["probe_connector"]  # a general plugin
    assert out["attention_backends"] == ["cpu", "oot", "reference"]  # the platform plugin's backend
    assert out["platform"] == "oot"
    assert out["probe_registrations"] == 1  # registered once, even where the state was inherited
    if method == "fork":
        assert out["inherited_groups"] == ["brigade.general_plugins", "brigade.platform_plugins"]
    else:
        assert out["inherited_groups"] == []  # a spawned worker starts empty and loads by itself


def test_engine_scope_leaves_out_api_only_groups_and_api_scope_adds_them(plugin_venv: PluginVenv):
    out = run_script(plugin_venv, """
import json
from brigade.plugins import load_plugins, process_plugin_manager, registries
load_plugins("engine")
engine = {"groups": sorted(process_plugin_manager().loaded_groups()),
          "io": registries.io_processors.names(), "stat": registries.stat_loggers.names()}
load_plugins("api")
api = {"groups": sorted(process_plugin_manager().loaded_groups()),
       "io": registries.io_processors.names(), "stat": registries.stat_loggers.names()}
load_plugins("api")  # idempotent
print(json.dumps({"engine": engine, "api": api, "again": registries.stat_loggers.names()}))
""", env={"BRIGADE_PLUGINS": "structured_text,jsonl"})
    assert out["engine"] == {"groups": ["brigade.general_plugins", "brigade.platform_plugins"], "io": [],
                             "stat": []}
    assert out["api"]["groups"] == ["brigade.endpoint_plugins", "brigade.general_plugins",
                                    "brigade.io_processor_plugins", "brigade.platform_plugins",
                                    "brigade.stat_logger_plugins"]
    assert (out["api"]["io"], out["api"]["stat"], out["again"]) == (["structured_text"], ["jsonl"], ["jsonl"])
