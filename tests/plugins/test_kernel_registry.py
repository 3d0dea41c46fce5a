"""The register_kernels hook: kernels keyed by (op, platform) in ``registries.kernels``, duplicates naming both
distributions, unknown ops refused inside the plugin's hook, and brigade-cuda's registrations with their A/B
switches (checked without a GPU: registering imports no kernel)."""

from __future__ import annotations

import math
import types

import pytest

from brigade.plugins import DuplicateNameError, PluginLoadError, hookimpl
from brigade.plugins.groups import GENERAL
from brigade.plugins.kernels import KERNEL_OPS, kernel_for, kernel_table
from brigade.plugins.manager import PluginManager
from brigade.plugins.records import PluginRecord


def _plugin(name: str, calls):
    @hookimpl
    def register_kernels(register):
        for args in calls:
            register(*args)

    return types.SimpleNamespace(__name__=name, BRIGADE_HOOKSPEC_VERSION="1.0", register_kernels=register_kernels)


def _load(manager: PluginManager, name: str, dist: str, calls) -> None:
    record = PluginRecord(name=name, group=GENERAL.name, scope=GENERAL.scope, distribution=dist, version="1.0",
                          value=f"{name}:plugin")
    manager._register(_plugin(name, calls), record, GENERAL)


def test_kernels_are_registered_per_op_and_platform_and_listed():
    manager = PluginManager()
    _load(manager, "fast", "vendor-a", [("rms_norm", "accel", "math:sqrt"), ("dense_gemm", "accel", len)])
    _load(manager, "other", "vendor-b", [("rms_norm", "other_accel", "math:floor")])
    table = kernel_table(manager.registries.kernels, "accel")
    assert [(r["op"], r["kernel"], r["distribution"]) for r in table] == [("dense_gemm", "len", "vendor-a"),
                                                                          ("rms_norm", "sqrt", "vendor-a")]
    assert manager.registries.kernels.get("rms_norm@accel") is math.sqrt  # the lazy path, imported on first use


def test_the_same_op_and_platform_from_two_distributions_names_both():
    manager = PluginManager()
    _load(manager, "fast", "vendor-a", [("rms_norm", "accel", "math:sqrt")])
    with pytest.raises(DuplicateNameError, match=r"kernel 'rms_norm@accel' from plugin 'faster' \(vendor-b.*"
                                                 r"plugin 'fast' \(vendor-a"):
        _load(manager, "faster", "vendor-b", [("rms_norm", "accel", "math:floor")])
    assert manager.registries.kernels.entry("rms_norm@accel").source.distribution == "vendor-a"


def test_an_unknown_op_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown kernel op 'rms_nrom'; the core's ops are rms_norm"):
        _load(PluginManager(), "typo", "vendor-a", [("rms_nrom", "accel", "math:sqrt")])


def test_kernel_for_serves_only_the_active_platforms_device_type():
    from brigade.plugins.kernels import registered_kernel

    def fast(*a):
        return None

    with registered_kernel("dense_gemm", "cpu", fast):  # the active platform here is the CPU
        assert kernel_for("dense_gemm", "cpu") is fast
        assert kernel_for("dense_gemm", "meta") is None
        assert kernel_for("rms_norm", "cpu") is None
    assert kernel_for("dense_gemm", "cpu") is None


# The Triton MLA decode kernel is opt-in (BRIGADE_CUDA_MLA_DECODE=1) until a GPU has run it.
@pytest.mark.parametrize("env,absent", [
    ({}, {"mla_decode"}),
    ({"BRIGADE_CUDA_MLA_DECODE": "1"}, set()),
    ({"BRIGADE_CUDA_FUSED_SAMPLER": "0"}, {"fused_sampler", "mla_decode"}),
    ({"BRIGADE_CUDA_NORM_FOLD": "0"}, {"rms_norm_gemm", "mla_decode"}),
    ({"BRIGADE_CUDA_SKINNY_GEMM": "0"}, {"dense_gemm", "silu_mul_gemm", "residual_gemm", "rms_norm_gemm",
                                         "mla_decode"}),
])
def test_brigade_cuda_registers_every_op_unless_an_ab_switch_leaves_it_out(monkeypatch, env, absent):
    from brigade_cuda import plugin

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen = []
    plugin.register_kernels(lambda op, platform, impl, **kw: seen.append((op, platform, impl)))
    fp8_ops = {op for op in KERNEL_OPS if op.startswith("fp8_")}  # brigade-fp8 registers those for its layers
    assert {op for op, _, _ in seen} == set(KERNEL_OPS) - fp8_ops - absent
    assert {platform for _, platform, _ in seen} == {"cuda"}
    assert all(isinstance(impl, str) for _, _, impl in seen)  # lazy paths: no Triton import at start-up


def test_a_failing_kernel_path_names_the_plugin():
    manager = PluginManager()
    _load(manager, "ghost", "vendor-g", [("silu_and_mul", "accel", "no_such_module_anywhere:kernel")])
    with pytest.raises(PluginLoadError, match="plugin 'ghost' \\(vendor-g"):
        manager.registries.kernels.get("silu_and_mul@accel")
