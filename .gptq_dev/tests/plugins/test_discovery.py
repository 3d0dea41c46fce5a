"""Discovery through real installs: entry points appear with pip install and vanish with pip uninstall;
failures are reported with their reason; the builtin plugin always loads; duplicates name both dists."""

from __future__ import annotations

from plugin_env import REPO_ROOT, PluginVenv, record


def test_install_makes_a_plugin_appear_and_uninstall_makes_it_disappear(plugin_venv: PluginVenv):
    names = lambda: [p["name"] for p in plugin_venv.plugins_json()["plugins"]]  # noqa: E731
    assert "myaccel" not in names()
    plugin_venv.install(REPO_ROOT / "examples" / "oot_platform")
    try:
        row = record(plugin_venv.plugins_json(), "myaccel")
        assert row["distribution"] == "my-brigade-platform" and row["version"] == "0.1.0"
        assert row["group"] == "brigade.platform_plugins"
        assert row["hooks"] == ["register_platforms"]
        assert row["status"] == "platform not detected"
        assert row["platforms"] == {"myaccel": "not detected"}
    finally:
        plugin_venv.uninstall("my-brigade-platform")
    assert "myaccel" not in names()


def test_every_installed_plugin_is_listed_with_distribution_group_scope_and_hooks(default_run):
    listing = default_run.json()
    probe = record(listing, "probe")
    assert probe["distribution"] == "brigade-fixture-probe"
    assert probe["group"] == "brigade.general_plugins" and probe["scope"] == "every process"
    assert probe["hooks"] == ["register_models", "register_quantization_methods", "register_kv_connectors"]
    assert probe["status"] == "loaded"
    assert probe["registered"] == {"models": ["ProbeForCausalLM"], "quantization_methods": ["probe_quant"],
                                   "kv_connectors": ["probe_connector"]}
    cuda = record(listing, "cuda")
    assert (cuda["distribution"], cuda["group"]) == ("brigade-cuda", "brigade.platform_plugins")
    assert cuda["status"] == "platform not detected"
    assert cuda["registered"]["attention_backends"] == ["triton"]
    assert record(listing, "structured_text")["scope"] == "API process"
    assert record(listing, "jsonl")["registered"] == {"stat_loggers": ["jsonl"]}
    builtin = record(listing, "builtin")
    assert (builtin["distribution"], builtin["status"]) == ("brigade", "loaded")


def test_duplicate_name_fails_the_second_plugin_naming_both_distributions(default_run):
    listing = default_run.json()
    assert record(listing, "dup_a")["status"] == "loaded"
    dup_b = record(listing, "dup_b")
    assert dup_b["status"] == "failed"
    assert "DuplicateNameError" in dup_b["reason"]
    assert "brigade-fixture-dup-a" in dup_b["reason"] and "brigade-fixture-dup-b" in dup_b["reason"]
    assert dup_b["registered"] == {}  # nothing half-registered


def test_duplicate_between_two_named_plugins_is_fatal(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLUGINS": "dup_a,dup_b"})
    assert result.returncode == 1
    assert "brigade-fixture-dup-a" in result.stderr and "brigade-fixture-dup-b" in result.stderr
    assert "override=True" in result.stderr


def test_wrong_hookspec_major_version_names_both_versions(default_run):
    row = record(default_run.json(), "wrong_version")
    assert row["status"] == "failed" and row["hookspec_version"] == "2.0"
    assert "HookspecVersionError" in row["reason"]
    assert "hook specs 2.0" in row["reason"] and "hook specs 1.0" in row["reason"]


def test_misspelt_hook_is_reported_not_ignored(default_run):
    row = record(default_run.json(), "typo_hook")
    assert row["status"] == "failed"
    assert "register_attention_backend" in row["reason"]


def test_choices_for_cli_flags_list_what_is_installed(default_run):
    choices = default_run.json()["choices"]
    assert "probe_quant" in choices["quantization"]
    assert {"reference", "triton", "oot", "dup"} <= set(choices["attention_backend"])
    assert "probe_connector" in choices["kv_connector"]
    assert choices["io_processor"] == ["structured_text"]
