"""Operator controls over real installs: BRIGADE_PLUGINS and BRIGADE_ENDPOINT_PLUGINS (docs/plugins.md,
"Operator controls"): each allowlist loads exactly what it names, a name not installed is fatal, and an unset
endpoint allowlist is noted once, in the INFO summary line, naming what is installed but disabled, while an empty
one is silent. Strict mode is in
test_load_failures.py."""

from __future__ import annotations

from plugin_env import PluginVenv, record, run_script

NON_ENDPOINT = ("probe", "broken", "dup_a", "dup_b", "wrong_version", "typo_hook", "cuda", "rocm", "oot",
                "detect_a", "detect_b", "structured_text", "jsonl")
ENDPOINT_NOTE = "endpoint plugins off by default: "


def test_empty_allowlist_loads_only_the_core_builtin_plugin(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLUGINS": ""})
    assert result.returncode == 0, result.stderr
    listing = result.json()
    assert record(listing, "builtin")["status"] == "loaded"
    for name in NON_ENDPOINT:
        row = record(listing, name)
        assert row["status"] == "disabled by allowlist", (name, row)
        assert row["reason"] == "not in BRIGADE_PLUGINS=" and row["hooks"] == []  # never imported
    assert "broken on purpose" not in result.stderr
    assert listing["platform"]["name"] == "cpu"
    assert listing["registries"]["attention_backends"] == ["cpu", "reference"]


def test_allowlist_loads_exactly_the_named_plugins(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLUGINS": "probe, oot", "BRIGADE_OOT_DEVICE": "1"})
    assert result.returncode == 0, result.stderr
    listing = result.json()
    assert {p["name"] for p in listing["plugins"] if p["status"] == "loaded"} == {"builtin", "probe", "oot"}
    assert record(listing, "broken")["reason"] == "not in BRIGADE_PLUGINS=oot,probe"
    assert listing["platform"]["name"] == "oot"
    assert listing["registries"]["attention_backends"] == ["cpu", "oot", "reference"]


def test_allowlist_naming_an_uninstalled_plugin_is_fatal(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLUGINS": "probe,no_such_plugin"})
    assert result.returncode == 1
    assert "'no_such_plugin'" in result.stderr and "installed:" in result.stderr and "probe" in result.stderr
    endpoint = plugin_venv.plugins({"BRIGADE_PLUGINS": "reset_prefix_cache"})
    assert endpoint.returncode == 1
    assert "reset_prefix_cache is an endpoint plugin, enabled with BRIGADE_ENDPOINT_PLUGINS" in endpoint.stderr


def test_a_named_plugin_that_fails_is_fatal_with_its_reason(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLUGINS": "probe,broken"})
    assert result.returncode == 1
    assert "plugin 'broken' (brigade-fixture-broken 0.1.0)" in result.stderr
    assert "the operator named it in BRIGADE_PLUGINS" in result.stderr and "broken on purpose" in result.stderr


def test_endpoint_allowlist_enables_exactly_the_named_endpoints_regardless_of_brigade_plugins(
        plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_ENDPOINT_PLUGINS": "reset_prefix_cache", "BRIGADE_PLUGINS": ""})
    assert result.returncode == 0, result.stderr
    listing = result.json()
    row = record(listing, "reset_prefix_cache")
    assert row["status"] == "loaded" and row["registered"] == {"endpoints": ["reset_prefix_cache"]}
    assert record(listing, "embed_only")["reason"] == "not in BRIGADE_ENDPOINT_PLUGINS=reset_prefix_cache"
    assert "endpoint plugins are installed but not enabled" not in result.stderr


def test_endpoint_allowlist_naming_an_uninstalled_endpoint_is_fatal(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_ENDPOINT_PLUGINS": "reset_prefix_cache,nope"})
    assert result.returncode == 1
    assert "'nope'" in result.stderr and "reset_prefix_cache" in result.stderr


def test_endpoint_required_tasks_gate_against_the_servers_tasks(plugin_venv: PluginVenv):
    out = run_script(plugin_venv, """
import json
from brigade.plugins import load_plugins, registries, select_endpoints
load_plugins("api")
gen = [r.name for r in select_endpoints(["generate"])]
embed = [r.name for r in select_endpoints(["embed"])]
router = registries.endpoints.get("reset_prefix_cache")(type("S", (), {"engine_client": None, "api_key": None}))
print(json.dumps({"generate": gen, "embed": embed, "routes": [r.path for r in router.routes],
                  "tasks": list(registries.endpoints.entry("embed_only").extra["required_tasks"])}))
""", env={"BRIGADE_ENDPOINT_PLUGINS": "reset_prefix_cache,embed_only"})
    assert out["generate"] == ["reset_prefix_cache"]
    assert out["embed"] == ["embed_only"]
    assert out["tasks"] == ["embed"]
    assert out["routes"] == ["/admin/reset_prefix_cache"]


_PLUGIN_LOG = """
import json, logging
records = []
class Held(logging.Handler):
    def emit(self, record):
        records.append([record.levelname, record.getMessage()])
log = logging.getLogger("brigade.plugins")
log.addHandler(Held())
log.setLevel(logging.DEBUG)
from brigade.plugins import load_plugins
load_plugins("api")
print(json.dumps(records))
"""


def test_endpoint_allowlist_unset_is_noted_once_at_info_and_empty_is_silent(plugin_venv: PluginVenv, default_run):
    empty = plugin_venv.plugins({"BRIGADE_ENDPOINT_PLUGINS": ""})
    assert empty.returncode == 0, empty.stderr
    for run in (default_run, empty):
        listing = run.json()
        assert listing["registries"]["endpoints"] == []
        assert record(listing, "reset_prefix_cache")["status"] == "disabled by allowlist"
    unset_log = run_script(plugin_venv, _PLUGIN_LOG)
    empty_log = run_script(plugin_venv, _PLUGIN_LOG, env={"BRIGADE_ENDPOINT_PLUGINS": ""})
    notes = [(level, text) for level, text in unset_log if ENDPOINT_NOTE in text]
    assert len(notes) == 1 and notes[0][0] == "INFO" and "reset_prefix_cache" in notes[0][1], unset_log
    assert not any(ENDPOINT_NOTE in text for _, text in empty_log)
    summaries = [text for level, text in unset_log if level == "INFO" and text.startswith("plugins: ")]
    assert len(summaries) == 1 and "structured_text" in summaries[0], unset_log  # one line for the whole load
    assert "BRIGADE_ENDPOINT_PLUGINS is unset" in record(default_run.json(), "reset_prefix_cache")["reason"]
    assert record(empty.json(), "reset_prefix_cache")["reason"] == "not in BRIGADE_ENDPOINT_PLUGINS="
