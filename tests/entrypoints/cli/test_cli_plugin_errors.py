"""Plugin failures met by the ``brigade`` command itself: one line naming what is wrong, never a traceback,
and for ``serve`` before the port is bound or the engine starts."""

from __future__ import annotations

import os
import subprocess

import pytest
from remote_server import brigade_command, find_free_port


def run(*argv: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BRIGADE_")} | env
    return subprocess.run([*brigade_command(), *argv], env=full_env, capture_output=True, text=True, timeout=120)


def test_an_unknown_forced_platform_is_one_line_before_serve_binds(smollm2_path):
    port = find_free_port()
    result = run("serve", str(smollm2_path), "--port", str(port), BRIGADE_PLATFORM="nosuch")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("brigade serve: error: BRIGADE_PLATFORM=nosuch but no installed plugin registers "
                                "platform 'nosuch'; registered platforms: cpu")
    assert "Traceback" not in result.stderr and "KV cache" not in result.stderr  # no engine was started


def test_an_unknown_forced_platform_is_one_line_for_generate_and_bench(smollm2_path):
    for argv in (["generate", "hi", "--model", str(smollm2_path)], ["bench", "latency", str(smollm2_path)]):
        result = run(*argv, BRIGADE_PLATFORM="nosuch")
        assert result.returncode == 2, result.stderr
        # only the error: the endpoint-plugin notice concerns servers and is not replayed here
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"brigade {argv[0]}: error: BRIGADE_PLATFORM=nosuch")


# ---- BRIGADE_PLUGINS excluding an installed plugin, and names in the wrong allowlist ------------------------

def _installed_plugin(group: str, name: str) -> bool:
    import importlib.metadata

    return any(ep.name == name for ep in importlib.metadata.entry_points(group=group))


def assert_one_error_line(result: subprocess.CompletedProcess, prefix: str) -> str:
    """Non-zero exit, no traceback, and the error is the one line of stderr; returns it."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    return lines[0]


@pytest.mark.parametrize("flags,group,plugin", [
    (["--quantization", "gptq"], "brigade.general_plugins", "gptq"),
    (["--io-processor-plugin", "structured_text"], "brigade.io_processor_plugins", "structured_text"),
    (["--kv-transfer-config", '{"kv_connector": "shm"}'], "brigade.general_plugins", "shm"),
])
def test_a_flag_naming_a_plugin_the_allowlist_excludes_says_so(smollm2_path, flags, group, plugin):
    if not _installed_plugin(group, plugin) or not _installed_plugin("brigade.platform_plugins", "cuda"):
        pytest.skip(f"needs the {plugin} and cuda plugins installed")
    result = run("serve", str(smollm2_path), *flags, BRIGADE_PLUGINS="cuda")
    line = assert_one_error_line(result, "brigade serve: error: ")
    assert f"'{plugin}' is not available: the installed plugin '{plugin}' (" in line, line
    assert f"is excluded by BRIGADE_PLUGINS=cuda; include it with BRIGADE_PLUGINS=cuda,{plugin}" in line, line
    assert "not installed" not in line and "none installed" not in line, line


def test_a_flag_value_no_plugin_provides_names_the_excluded_plugins(smollm2_path):
    if not _installed_plugin("brigade.general_plugins", "gptq"):
        pytest.skip("needs the gptq plugin installed")
    line = assert_one_error_line(run("serve", str(smollm2_path), "--quantization", "nosuch", BRIGADE_PLUGINS=""),
                                 "brigade serve: error: ")
    assert "--quantization 'nosuch' is not available: no loaded plugin provides it, and BRIGADE_PLUGINS=\"\" " \
           "excludes the installed plugins " in line and "gptq" in line, line
    plain = assert_one_error_line(run("serve", str(smollm2_path), "--quantization", "nosuch"), "brigade serve: error: ")
    assert plain.startswith("brigade serve: error: --quantization 'nosuch' is not installed; installed: ")  # unchanged


def test_an_endpoint_plugin_in_brigade_plugins_points_to_the_endpoint_allowlist(smollm2_path):
    if not _installed_plugin("brigade.endpoint_plugins", "reset_prefix_cache"):
        pytest.skip("needs the reset_prefix_cache endpoint plugin installed")
    line = assert_one_error_line(run("serve", str(smollm2_path), BRIGADE_PLUGINS="reset_prefix_cache"), "brigade: ")
    assert "which no installed plugin provides" not in line, line  # it is installed: that claim was false
    assert ("BRIGADE_PLUGINS names 'reset_prefix_cache', but reset_prefix_cache is an endpoint plugin, enabled with "
            "BRIGADE_ENDPOINT_PLUGINS instead (BRIGADE_ENDPOINT_PLUGINS=reset_prefix_cache)") in line, line
    both = assert_one_error_line(run("serve", str(smollm2_path), BRIGADE_PLUGINS="reset_prefix_cache,nosuch"),
                                 "brigade: ")
    assert "'nosuch', which no installed plugin provides" in both and "is an endpoint plugin" in both, both


def test_another_plugin_in_the_endpoint_allowlist_points_to_brigade_plugins(smollm2_path):
    if not _installed_plugin("brigade.io_processor_plugins", "structured_text"):
        pytest.skip("needs the structured_text io_processor plugin installed")
    line = assert_one_error_line(run("serve", str(smollm2_path), BRIGADE_ENDPOINT_PLUGINS="structured_text"),
                                 "brigade: ")
    assert ("BRIGADE_ENDPOINT_PLUGINS names 'structured_text', but structured_text is an io_processor plugin, not an "
            "endpoint plugin: BRIGADE_PLUGINS selects it") in line, line
    assert "which no installed endpoint plugin provides" not in line, line
