"""The start-up of the engine commands as a user sees it: a default ``brigade serve`` logs no WARNING and one line
on plugins, and Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM at any moment of a
start-up ends the command within 2 s, with one stderr line, status 130 or 143, no traceback, and no process left."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from remote_server import brigade_command, find_free_port

EXIT_WITHIN_S = 2.0


def _session_processes(sid: int) -> list[str]:
    """Live (not zombie) processes of session ``sid``, as "pid state cmdline"."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[4]) == sid and fields[0] != b"Z":
            found.append(f"{entry} {fields[0].decode()} {cmdline[:120]}")
    return found


def _start(argv: list[str], **env: str) -> subprocess.Popen:
    """``brigade ARGV`` in its own session, on one core with one thread (a slow start-up, so that even the last
    delay falls inside it), logging only warnings: a clean start-up prints nothing on stderr."""
    return subprocess.Popen([*brigade_command(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
                            env={**os.environ, "OMP_NUM_THREADS": "1", "BRIGADE_LOGGING_LEVEL": "WARNING", **env})


def _assert_stopped_cleanly(proc: subprocess.Popen, sig: signal.Signals, sent_at: float) -> None:
    try:
        out, err = proc.communicate(timeout=EXIT_WITHIN_S + 3)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running {EXIT_WITHIN_S + 3:.0f} s after {sig.name}")
    took = time.monotonic() - sent_at
    assert proc.returncode == 128 + sig, (proc.returncode, err[-3000:])
    assert took <= EXIT_WITHIN_S, f"{took:.1f} s to exit"
    lines = err.splitlines()
    assert "Traceback" not in err and len(lines) <= 1, err[-3000:]
    assert lines == [] or "interrupted by " + sig.name in lines[0], lines
    left = _session_processes(proc.pid)
    deadline = sent_at + EXIT_WITHIN_S
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _session_processes(proc.pid)
    assert not left, left


# brigade serve with -tp 3 -pp 2: a front end, an engine process and six spawned workers; on one core its start-up
# (imports, plugins, the engine, the workers' spawn and imports, weights, KV cache, uvicorn) lasts about 25 s, so
# even the last delay falls inside it (-tp 3 alone can be ready in 14 s).
SERVE_CASES = [(1, signal.SIGINT), (3, signal.SIGINT), (6, signal.SIGINT), (10, signal.SIGINT),
               (15, signal.SIGINT), (8, signal.SIGTERM)]


@pytest.mark.parametrize("delay_s,sig", SERVE_CASES, ids=[f"{s.name}-at-{d}s" for d, s in SERVE_CASES])
def test_serve_start_up_ends_at_once_on_a_signal(smollm2_path, delay_s, sig):
    proc = _start(["serve", str(smollm2_path), "-tp", "3", "-pp", "2", "--host", "127.0.0.1", "--port",
                   str(find_free_port()), "--uvicorn-log-level", "warning"])
    time.sleep(delay_s)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    if sig is signal.SIGINT:  # Ctrl-C at a terminal: the whole foreground process group
        os.killpg(proc.pid, sig)
    else:  # a supervisor stopping the server: the main process alone
        proc.send_signal(sig)
    _assert_stopped_cleanly(proc, sig, time.monotonic())


@pytest.mark.parametrize("argv", [["generate", "Hello", "{model}", "--max-tokens", "4"],
                                  ["bench", "latency", "{model}", "--input-len", "8", "--output-len", "4"]],
                         ids=["generate", "bench-latency"])
def test_offline_commands_end_at_once_on_ctrl_c(smollm2_path, argv):
    proc = _start([a.format(model=smollm2_path) for a in argv])
    time.sleep(4)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGINT)
    _assert_stopped_cleanly(proc, signal.SIGINT, time.monotonic())


def test_a_default_serve_starts_without_warnings_and_one_line_on_plugins(smollm2_path):
    """``brigade serve`` as setup left it (every example plugin installed, no BRIGADE_* variable): no WARNING,
    and the plugin loading in one INFO line; the full list stays in ``brigade plugins``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIGADE_") or k == "BRIGADE_CACHE_DIR"}
    proc = subprocess.Popen([*brigade_command(), "serve", "--host", "127.0.0.1", "--port", str(find_free_port()),
                             "--max-model-len", "256", "--num-gpu-blocks-override", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "serving " in line or time.monotonic() > deadline:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        lines += proc.communicate(timeout=60)[0].splitlines()
    log = "\n".join(lines)
    assert any("serving " in line for line in lines), log[-3000:]
    assert not [line for line in lines if line.startswith("WARNING")], log[-3000:]
    plugin_lines = [line for line in lines if "plugin" in line and " platform cpu: " not in line]
    assert len(plugin_lines) == 1 and "plugins: " in plugin_lines[0], plugin_lines
