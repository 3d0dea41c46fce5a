"""ServerProcess: ``brigade serve`` started by ``brigade bench serve --launch``, in its own process group.

The server runs as a child process (never in the benchmark's event loop), is polled on ``/health``
until it answers 200, and is stopped with SIGTERM (then SIGKILL after a grace period) on exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time


class ServerStartError(RuntimeError):
    """The launched server exited or did not become healthy in time; the message has its log tail."""


class ServerProcess:
    """A context manager around one ``brigade serve`` child process.

    Args:
        serve_argv: the arguments after ``brigade serve`` (model, engine flags, --host, --port).
        base_url: where the server will answer, e.g. ``http://127.0.0.1:8000``.
        startup_timeout_s: how long to wait for ``/health`` to answer 200.
    """

    def __init__(self, serve_argv: list[str], base_url: str, *, startup_timeout_s: float = 600.0):
        self.argv = [sys.executable, "-m", "brigade.entrypoints.cli.main", "serve", *serve_argv]
        self.base_url = base_url.rstrip("/")
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.log_path: str | None = None

    def __enter__(self) -> ServerProcess:
        self._refuse_busy_port()
        log = tempfile.NamedTemporaryFile("w", prefix="brigade-bench-serve-", suffix=".log", delete=False)
        self.log_path = log.name
        # A new session: the server and its EngineCore child are stopped together.
        self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _refuse_busy_port(self) -> None:
        """Raise ServerStartError when something already listens where the server is to listen: the child
        would fail to bind while the health poll reached the other server, benchmarking the wrong one."""
        import socket
        from urllib.parse import urlparse

        url = urlparse(self.base_url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        try:
            with socket.create_connection((host, port), timeout=1.0):
                pass
        except OSError:
            return  # nothing listens there: the port is free for the launched server
        raise ServerStartError(f"{host}:{port} already has a server listening; stop it, or give --base-url "
                               "another port for the launched one (or drop --launch to benchmark that one)")

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def log_tail(self, num_chars: int = 3000) -> str:
        if self.log_path is None:
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-num_chars:]

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"brigade serve exited with status {self.process.returncode} "
                                       f"(log {self.log_path}):\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet: keep polling until the deadline
            time.sleep(0.5)
        raise ServerStartError(f"brigade serve was not healthy after {self.startup_timeout_s:.0f} s "
                               f"(log {self.log_path}):\n{self.log_tail()}")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server (it stops its EngineCore itself); after ``grace_s``, or once it has exited,
        SIGKILL whatever is left of its process group."""
        if self.process is None:
            return
        pgid = self.process.pid  # start_new_session made the server its group's leader
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass  # killed with its group below
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the whole group has already exited
        self.process.wait()
