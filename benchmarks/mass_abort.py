"""How the API server holds up when a client drops a completions request of very many prompts.

Starts ``brigade serve MODEL`` on loopback, posts one ``/v1/completions`` request whose prompt is a list of
``--num-prompts`` token-id prompts, drops the connection after ``--drop-after`` seconds, and polls ``/health`` every
50 ms from the post until ``--watch`` seconds after the drop (the latency of each answer). Then it sends SIGTERM
while the aborts may still be draining and times the server's exit against ``--shutdown-timeout``. Prints one JSON
record (and writes it to ``--json``): the worst and median ``/health`` latency, failed polls, and the exit time.

Usage::

    python benchmarks/mass_abort.py [MODEL] --num-prompts 100000 [--json out.json]

MODEL defaults to the set-up's model (``brigade.cache_paths.default_model``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from brigade.cache_paths import default_model
from brigade.utils import get_open_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--num-prompts", type=int, default=100_000)
    parser.add_argument("--drop-after", type=float, default=3.0, help="seconds before the client disconnects")
    parser.add_argument("--watch", type=float, default=10.0, help="seconds of /health polling after the drop")
    parser.add_argument("--shutdown-timeout", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = args.model or str(default_model())
    port = get_open_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile(mode="w+")
    server = subprocess.Popen([str(Path(sys.executable).with_name("brigade")), "serve", model, "--host", "127.0.0.1",
                               "--port", str(port), "--max-model-len", "256", "--disable-log-requests",
                               "--shutdown-timeout", str(args.shutdown_timeout)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        record = measure(base, args)
        start = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=args.shutdown_timeout + 60)
        record["sigterm_exit_s"] = round(time.monotonic() - start, 2)
        record["exit_status"] = server.returncode
        record["shutdown_timeout_s"] = args.shutdown_timeout
        log.seek(0)
        record["traceback_in_log"] = "Traceback" in log.read()
    finally:
        if server.poll() is None:
            server.kill()
    text = json.dumps(record, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


def measure(base: str, args) -> dict:
    deadline = time.monotonic() + 600
    while True:  # wait for the server
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("brigade serve did not come up in 600 s")
        time.sleep(0.2)
    name = httpx.get(base + "/v1/models").json()["data"][0]["id"]
    body = {"model": name, "prompt": [[1, 2, 3 + i % 100] for i in range(args.num_prompts)], "max_tokens": 64,
            "ignore_eos": True}
    dropped = threading.Event()

    def post_and_drop() -> None:
        try:
            httpx.post(base + "/v1/completions", json=body, timeout=args.drop_after)
        except httpx.TimeoutException:
            pass
        dropped.set()

    threading.Thread(target=post_and_drop, daemon=True).start()
    latencies, failures = [], 0
    stop_at = None
    while stop_at is None or time.monotonic() < stop_at:
        if stop_at is None and dropped.is_set():
            stop_at = time.monotonic() + args.watch
        start = time.monotonic()
        try:
            ok = httpx.get(base + "/health", timeout=30).status_code == 200
        except httpx.TransportError:
            ok = False
        latencies.append(time.monotonic() - start)
        failures += not ok
        time.sleep(0.05)
    return {"num_prompts": args.num_prompts, "body_bytes": len(json.dumps(body)), "health_polls": len(latencies),
            "health_failures": failures, "health_max_s": round(max(latencies), 3),
            "health_median_s": round(statistics.median(latencies), 4), "cpu_count": os.cpu_count()}


if __name__ == "__main__":
    main()
