"""A rank that stalls mid-stream (SIGSTOP: alive, but never joins the next collective) under ``brigade serve -tp 2``
(mp executor, gloo): once ``BRIGADE_DISTRIBUTED_TIMEOUT`` has passed, the driver rank's all-reduce fails, the
stream ends with an error event, the server exits 1 with one line naming the rank and the timeout, and no process
is left (the stopped one included). Never a hang."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from parallel_check import kill_rank_mid_stream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints"))
from remote_server import RemoteServer  # noqa: E402

TIMEOUT_S = 3


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_stalled_rank_fails_the_stream_and_the_server_exits(tiny_llama):
    path, _, _ = tiny_llama
    server = RemoteServer(path, ["--skip-tokenizer-init", "-tp", "2", "--served-model-name", "tiny", "--dtype",
                                 "float32", "--max-model-len", "128", "--disable-log-requests"],
                          env={"BRIGADE_DISTRIBUTED_TIMEOUT": str(TIMEOUT_S),
                               "BRIGADE_WORKER_MULTIPROC_METHOD": "fork"})
    try:
        placed = re.finditer(r"rank (\d)/2 \(local rank \d, device cpu\): .*?, pid (\d+)", server.log_tail(200_000))
        pids = {int(m.group(1)): int(m.group(2)) for m in placed}
        assert sorted(pids) == [0, 1], server.log_tail()
        body = {"model": "tiny", "prompt": [1, 5, 7, 9], "max_tokens": 100, "ignore_eos": True, "stream": True}
        start = time.monotonic()
        last = kill_rank_mid_stream(server, body, pids[1], signal.SIGSTOP)
        assert time.monotonic() - start >= TIMEOUT_S - 0.5  # it waited for the timeout, then failed
        assert last.startswith("brigade serve: error: the engine died (") and \
            "worker rank 0 failed: RuntimeError: " in last and "Timed out" in last and \
            f"(a collective stalled past BRIGADE_DISTRIBUTED_TIMEOUT={TIMEOUT_S} s: a peer rank is stopped or " \
            "stuck)); the server shut down" in last, last
    finally:
        for pid in pids.values() if "pids" in locals() else ():
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)
        server.stop()
    deadline = time.monotonic() + 20
    while alive := [p for p in pids.values() if _alive(p)]:
        assert time.monotonic() < deadline, f"workers left: {alive}"
        time.sleep(0.2)
