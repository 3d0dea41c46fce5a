"""The ``brigade serve`` that the command-line tests share (the ``server`` fixture of this folder's conftest)."""

from __future__ import annotations

from pathlib import Path

from remote_server import RemoteServer

MODEL_NAME = "smol"
MAX_MODEL_LEN = 128


def start_server(model: Path) -> RemoteServer:
    """The defaults of vLLM's logging flags: no request lines, the stats line (every second here)."""
    return RemoteServer(model, ["--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN),
                                "--max-num-seqs", "4"], env={"BRIGADE_LOG_STATS_INTERVAL": "1"})
