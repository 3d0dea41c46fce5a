"""The manager in this process: the builtin plugin's registrations, scopes, and idempotent loading.

A fresh PluginManager with ``BRIGADE_PLUGINS=""`` sees only the core's builtin plugin, whatever is
installed in the development environment (the builtin plugin ignores the allowlist by design).
"""

from __future__ import annotations

import pytest

from brigade.plugins import PluginManager, PluginStatus, UnknownNameError
from brigade.plugins.builtin import BUILTIN_LOGITS_PROCESSORS, LLAMA_FAMILY


@pytest.fixture
def manager(monkeypatch) -> PluginManager:
    for var in ("BRIGADE_ENDPOINT_PLUGINS", "BRIGADE_PLATFORM", "BRIGADE_PLUGINS_STRICT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BRIGADE_PLUGINS", "")
    return PluginManager()


def test_builtin_plugin_registers_the_core_components_and_they_resolve(manager: PluginManager):
    manager.load("engine")
    regs = manager.registries
    assert regs.platforms.names() == ["cpu"]
    assert regs.attention_backends.get("reference").__name__ == "ReferenceAttentionBackend"
    model_classes = {regs.models.get(arch) for arch in LLAMA_FAMILY}
    assert len(model_classes) == 1 and next(iter(model_classes)).__name__ == "LlamaForCausalLM"
    assert regs.logits_processors.names() == sorted(BUILTIN_LOGITS_PROCESSORS)
    for name in regs.logits_processors.names():
        assert regs.logits_processors.get(name).name == name
    (builtin,) = [r for r in manager.records() if r.status is PluginStatus.LOADED]
    assert (builtin.name, builtin.distribution, builtin.status) == ("builtin", "brigade", PluginStatus.LOADED)
    assert builtin.hookspec_version == "1.0"


def test_cpu_platform_is_chosen_with_a_reason(manager: PluginManager):
    choice = manager.platform_choice()
    assert choice.name == "cpu" and choice.platform_cls.__name__ == "CpuPlatform"
    assert choice.source.distribution == "brigade"
    assert choice.reason.endswith("falling back to the core cpu platform")
    assert manager.current_platform() is choice.platform_cls  # resolved once


def test_loading_is_idempotent_and_scopes_add_groups(manager: PluginManager):
    manager.load("engine")
    assert manager.loaded_groups() == {"brigade.general_plugins", "brigade.platform_plugins"}
    manager.load("engine")
    manager.load("api")
    assert len(manager.loaded_groups()) == 5
    assert [r.name for r in manager.records()].count("builtin") == 1
    assert all(r.status is PluginStatus.DISABLED for r in manager.records() if r.name != "builtin")
    assert manager.registries.attention_backends.names() == ["cpu", "reference"]


def test_unknown_scope_and_unknown_names(manager: PluginManager):
    with pytest.raises(ValueError, match="unknown plugin scope 'worker'; use one of engine, api"):
        manager.load("worker")
    manager.load("engine")
    with pytest.raises(UnknownNameError, match="unknown attention backend 'flash'; installed: cpu, reference"):
        manager.registries.attention_backends.get("flash")


def test_a_new_manager_shares_nothing_with_another(manager: PluginManager):
    manager.load("engine")
    other = PluginManager()
    assert other.registries.attention_backends.names() == [] and other.records() == []
