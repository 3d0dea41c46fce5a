"""Registries: lazy "module:Attr" values, duplicate names naming both distributions, override, and
unknown names listing what is installed."""

from __future__ import annotations

import pytest

from brigade.attention.reference import ReferenceAttentionBackend
from brigade.plugins import DuplicateNameError, PluginLoadError, UnknownNameError
from brigade.plugins.registry import PluginSource, Registries, Registry, import_lazy_path, parse_lazy_path

A = PluginSource("fast_attn", "vendor-a", "1.2.0")
B = PluginSource("faster_attn", "vendor-b", "0.3.1")


def test_lazy_path_is_imported_on_first_get_and_cached():
    registry = Registry("attention backend")
    registry.add("reference", "brigade.attention.reference:ReferenceAttentionBackend", A)
    assert registry.entry("reference").value == "brigade.attention.reference:ReferenceAttentionBackend"
    first = registry.get("reference")
    assert first is ReferenceAttentionBackend and registry.get("reference") is first


def test_objects_are_returned_as_registered():
    registry = Registry("model architecture")
    registry.add("Ref", ReferenceAttentionBackend, A)
    assert registry.get("Ref") is ReferenceAttentionBackend
    assert "Ref" in registry and len(registry) == 1 and list(registry) == ["Ref"]


def test_duplicate_name_from_another_distribution_names_both():
    registry = Registry("attention backend")
    registry.add("flash", "brigade.attention.reference:ReferenceAttentionBackend", A)
    with pytest.raises(DuplicateNameError) as info:
        registry.add("flash", ReferenceAttentionBackend, B)
    message = str(info.value)
    assert "attention backend 'flash' from plugin 'faster_attn' (vendor-b 0.3.1)" in message
    assert "the one from plugin 'fast_attn' (vendor-a 1.2.0)" in message
    assert isinstance(info.value, PluginLoadError)
    assert registry.entry("flash").source == A  # unchanged


def test_override_replaces_on_purpose():
    registry = Registry("attention backend")
    registry.add("flash", "brigade.attention.reference:ReferenceAttentionBackend", A)
    registry.get("flash")  # resolved and cached before the override
    registry.add("flash", dict, B, override=True)
    assert registry.entry("flash").source == B and registry.get("flash") is dict


def test_unknown_name_lists_installed_names_and_is_key_and_value_error():
    registry = Registry("quantization method")
    registry.add("fp8", dict, A)
    registry.add("awq", list, A)
    with pytest.raises(UnknownNameError) as info:
        registry.get("gptq")
    assert str(info.value) == "unknown quantization method 'gptq'; installed: awq, fp8"
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    with pytest.raises(UnknownNameError, match="installed: none"):
        Registry("KV connector").get("nixl")


def test_lazy_path_that_fails_to_import_names_the_plugin():
    registry = Registry("attention backend")
    registry.add("ghost", "no_such_module_anywhere:Backend", B)
    with pytest.raises(PluginLoadError, match=r"'ghost' from plugin 'faster_attn' \(vendor-b 0.3.1\).*"
                                              r"ModuleNotFoundError"):
        registry.get("ghost")


@pytest.mark.parametrize("bad", ["no_colon", ":Attr", "module:", "a:b:c"])
def test_malformed_lazy_paths_are_refused_at_registration(bad):
    with pytest.raises(ValueError, match="must look like 'package.module:Attr'"):
        Registry("model architecture").add("X", bad, A)


def test_lazy_path_helpers_follow_dotted_attributes():
    assert parse_lazy_path("a.b:C.d") == ("a.b", "C.d")
    assert import_lazy_path("brigade.attention.reference:ReferenceAttentionBackend.forward") is \
        ReferenceAttentionBackend.forward


def test_registries_have_one_registry_per_registration_hook():
    from brigade.plugins.hookspecs import REGISTRATION_HOOKS

    registries = Registries()
    assert sorted(registries.as_names()) == sorted(h.removeprefix("register_") for h in REGISTRATION_HOOKS)
    assert registries.for_hook("register_kv_connectors") is registries.kv_connectors


def test_registries_of_classes_refuse_a_value_that_cannot_be_called():
    registries = Registries()
    with pytest.raises(ValueError, match=r"stat logger 'garbage' must be registered as a class or factory .* "
                                         r"got int 42"):
        registries.stat_loggers.add("garbage", 42, A)
    assert "garbage" not in registries.stat_loggers
    registries.stat_loggers.add("lazy", "brigade.interfaces:StatLoggerBase", A)  # a path is checked on use
    registries.endpoints.add("router", lambda state: None, A)
    with pytest.raises(ValueError, match="endpoint 'x' must be registered as a class or factory"):
        registries.endpoints.add("x", "not a path".split(), A)


class _Raises:
    def __init__(self, config):
        raise RuntimeError(f"cannot start with {config}")


def test_create_calls_the_factory_and_names_the_plugin_when_it_fails():
    registry = Registry("stat logger", callable_values=True)
    registry.add("ok", dict, A)
    registry.add("bad", _Raises, B)
    registry.add("lazy_module", "brigade.plugins.registry:logger", A)  # resolves to a Logger, not callable
    assert registry.create("ok", a=1) == {"a": 1}
    with pytest.raises(PluginLoadError) as info:
        registry.create("bad", "cfg")
    assert str(info.value) == ("stat logger 'bad' from plugin 'faster_attn' (vendor-b 0.3.1) failed to start: "
                               "RuntimeError: cannot start with cfg")
    with pytest.raises(PluginLoadError, match="stat logger 'lazy_module' from plugin 'fast_attn' .* is a Logger, "
                                              "not a class or factory"):
        registry.create("lazy_module")
