"""The hook-spec module: versioned, pluggy-marked, exactly the contract's hooks, each documented."""

from __future__ import annotations

import inspect

import pluggy
import pytest

from brigade.plugins import hookspecs

CONTRACT_HOOKS = {"register_platforms", "register_attention_backends", "register_models",
                  "register_quantization_methods", "register_kv_connectors", "register_io_processors",
                  "register_endpoints", "register_stat_loggers", "register_logits_processors",
                  "register_kernels"}


def spec_functions() -> dict[str, object]:
    return {name: fn for name, fn in vars(hookspecs).items()
            if inspect.isfunction(fn) and hasattr(fn, "brigade_spec")}


def test_version_and_project_name():
    assert hookspecs.HOOKSPEC_VERSION == "1.0"
    assert hookspecs.hookspec.project_name == "brigade" and hookspecs.hookimpl.project_name == "brigade"


def test_exactly_the_contract_hooks_are_specified():
    assert set(spec_functions()) == CONTRACT_HOOKS == set(hookspecs.REGISTRATION_HOOKS)


@pytest.mark.parametrize("name", sorted(CONTRACT_HOOKS))
def test_each_hook_takes_register_and_documents_summary_args_returns_and_firstresult(name):
    fn = spec_functions()[name]
    assert list(inspect.signature(fn).parameters) == ["register"]
    doc = inspect.getdoc(fn)
    assert doc.splitlines()[0].strip(), "one-line summary"
    assert "Args:\n    register:" in doc and "Returns:" in doc and "firstresult" in doc
    assert fn.brigade_spec["firstresult"] is False  # registration hooks: every implementation runs


def test_pluggy_accepts_the_specs_and_validates_implementations():
    pm = pluggy.PluginManager("brigade")
    pm.add_hookspecs(hookspecs)

    class Bad:
        @hookspecs.hookimpl
        def register_models(self, register, extra):  # an argument the spec does not have
            pass

    with pytest.raises(pluggy.PluginValidationError):
        pm.register(Bad())


@pytest.mark.parametrize("version,major", [("1.0", "1"), ("1.x", "1"), ("2", "2"), (" 10.3 ", "10")])
def test_hookspec_major(version, major):
    assert hookspecs.hookspec_major(version) == major


def test_hookspec_major_rejects_empty():
    with pytest.raises(ValueError):
        hookspecs.hookspec_major("")
