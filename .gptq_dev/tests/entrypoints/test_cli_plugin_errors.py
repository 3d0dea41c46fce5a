"""Plugin failures met by the ``brigade`` command itself: one line naming what is wrong, never a traceback,
and for ``serve`` before the port is bound or the engine starts."""

from __future__ import annotations

import os
import subprocess

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
