"""No process outlives its parent: a SIGKILLed ``brigade serve`` takes its busy EngineCore with it within a second
or two, and a SIGKILLed offline ``LLM`` parent takes its multiprocessing worker with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent / "entrypoints"))
from remote_server import RemoteServer  # noqa: E402

EXIT_WITHIN_S = 3.0  # the watch polls every 0.2 s and allows 0.5 s of clean-up; the rest is slack for CI


def _spawned_children(pid: int) -> list[psutil.Process]:
    """The multiprocessing children of ``pid``, spawned or forked (not multiprocessing's resource tracker)."""
    return [c for c in psutil.Process(pid).children()
            if not any("resource_tracker" in part for part in c.cmdline())]


def _wait_gone(proc: psutil.Process, what: str) -> float:
    killed = time.monotonic()
    while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
        waited = time.monotonic() - killed
        assert waited < EXIT_WITHIN_S, f"{what} (pid {proc.pid}) still runs {waited:.1f} s after its parent died"
        time.sleep(0.05)
    return time.monotonic() - killed


def test_busy_engine_exits_when_the_server_is_killed(smollm2_path):
    server = RemoteServer(smollm2_path, ["--max-model-len", "1024", "--disable-log-requests"])
    try:
        (engine,) = _spawned_children(server.proc.pid)
        body = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True, "temperature": 0}

        def post() -> None:
            try:
                httpx.post(server.url("/v1/completions"), json=body, timeout=60)
            except httpx.TransportError:
                pass  # the server is killed under it

        clients = [threading.Thread(target=post, daemon=True) for _ in range(8)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 60
        while engine.cpu_percent(interval=0.2) < 20:  # queued work: the engine is computing
            assert time.monotonic() < deadline, "the engine never got busy"
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=10)
        _wait_gone(engine, "the EngineCore")
    finally:
        server.stop()


_OFFLINE_PARENT = """
import sys
from brigade import LLM, SamplingParams
if __name__ == "__main__":  # the worker is spawned: it imports this file again
    llm = LLM(sys.argv[1], max_model_len=512, distributed_executor_backend="mp")
    print("READY", flush=True)
    while True:
        llm.generate(["Once upon a time"] * 8, SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
"""


def test_worker_exits_when_the_offline_parent_is_killed(smollm2_path, tmp_path):
    script = tmp_path / "offline_parent.py"
    script.write_text(_OFFLINE_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(smollm2_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env={**os.environ, "BRIGADE_LOGGING_LEVEL": "ERROR"})
    try:
        assert parent.stdout.readline().strip() == "READY"
        (worker,) = _spawned_children(parent.pid)
        time.sleep(0.5)  # generating: the worker is mid-step
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        _wait_gone(worker, "the worker")
    finally:
        if parent.poll() is None:
            parent.kill()
