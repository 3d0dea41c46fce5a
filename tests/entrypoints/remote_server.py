"""RemoteServer: a real ``brigade serve`` subprocess on 127.0.0.1 and a free port, for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 300.0


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def brigade_command() -> list[str]:
    """The ``brigade`` console script of this interpreter's environment (the module when not installed)."""
    script = Path(sys.executable).with_name("brigade")
    return [str(script)] if script.exists() else [sys.executable, "-m", "brigade.entrypoints.cli.main"]


class RemoteServer:
    """Starts ``brigade serve MODEL ARGS`` and waits until GET /health answers 200.

    The server's output goes to a temporary log whose tail is shown when start-up fails.
    """

    def __init__(self, model: str | os.PathLike, args: list[str], *, env: dict[str, str] | None = None,
                 api_key: str | None = None, command: list[str] | None = None):
        """``command``: what runs ``brigade`` (another venv's ``python -m brigade.entrypoints.cli.main``, say);
        default: this environment's console script.

        The port is probed free here and bound by the server a second later; should another process take it in
        between (the server then exits at once saying it cannot listen), the server starts again on a new port.
        """
        self.api_key = api_key
        for attempt in range(3):
            self.port = find_free_port()
            self.base_url = f"http://127.0.0.1:{self.port}"
            cmd = [*(command or brigade_command()), "serve", str(model), "--host", "127.0.0.1", "--port",
                   str(self.port), *args]
            if api_key is not None:
                cmd += ["--api-key", api_key]
            self.log = tempfile.NamedTemporaryFile(prefix="brigade-serve-", suffix=".log", delete=False)
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})})
            try:
                self._wait_healthy()
                return
            except RuntimeError:
                taken = f"cannot listen on 127.0.0.1:{self.port}" in self.log_tail()
                self.stop()
                if not taken or attempt == 2:
                    raise
            except BaseException:
                self.stop()
                raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"brigade serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url("/health"), timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.1)
        raise TimeoutError(f"brigade serve not healthy after {STARTUP_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def url(self, path: str) -> str:
        return self.base_url + path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def openai_client(self, api_key: str | None = None):
        """The official client on this server, with its key unless ``api_key`` overrides it."""
        import openai

        return openai.OpenAI(base_url=self.url("/v1"), api_key=api_key or self.api_key or "unused", max_retries=0,
                             timeout=120)

    def log_tail(self, num_chars: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-num_chars:]

    def stop(self) -> None:
        """SIGTERM (graceful: the engine process is shut down too), then SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        os.unlink(self.log.name)


def error_of(response: httpx.Response, status: int) -> dict:
    """The ``error`` object of an OpenAI-shaped error response, after checking its status and its four keys."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error
