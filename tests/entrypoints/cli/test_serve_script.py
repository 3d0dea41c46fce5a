"""``scripts/serve.sh`` and what the README says of ``brigade serve``: the script takes the model first or with
--model, names only documents in the repository, and the README's address and /docs claims hold."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from cli_runner import run_cli
from remote_server import find_free_port


REPO = Path(__file__).resolve().parents[3]


def test_the_scripts_name_only_documents_in_the_repo():
    import re

    for script in sorted((REPO / "scripts").glob("*.sh")):
        for name in re.findall(r"[\w./-]+\.md\b", script.read_text()):
            assert (REPO / name).is_file(), f"{script.name} refers to {name}, which is not in the repository"


@pytest.fixture
def other_model(smollm2_path, tmp_path):
    folder = tmp_path / "other-model"
    folder.mkdir()
    for item in Path(smollm2_path).iterdir():
        (folder / item.name).symlink_to(item)
    return folder


def test_serve_script_serves_a_model_given_with_model(other_model):
    """./scripts/serve.sh --model X used to fail: 'MODEL ... and --model ... disagree'."""
    import httpx

    port = find_free_port()
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    proc = subprocess.Popen([str(REPO / "scripts" / "serve.sh"), "--model", str(other_model), "--port", str(port),
                             "--max-model-len", "64"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                if models.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert [m["id"] for m in models.json()["data"]] == ["other-model"]
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    assert f"starting brigade serve {other_model} on http://127.0.0.1:{port}" in out
    assert '"model": "other-model"' in out  # the printed examples name it


def test_serve_script_takes_the_model_as_its_first_argument(other_model):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:  # it parses, checks, then cannot bind
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([str(REPO / "scripts" / "serve.sh"), str(other_model), "--port", str(port)],
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"brigade serve: error: cannot listen on 127.0.0.1:{port}")
    assert "disagree" not in proc.stderr and f'"model": "other-model"' in proc.stdout
    command = next(line for line in proc.stdout.splitlines() if line.startswith("[serve] brigade serve "))
    assert command.split().count("--port") == 1 and command.split().count("--host") == 1, command


def test_readme_says_where_brigade_serve_listens(server):
    import httpx

    readme = (REPO / "README.md").read_text()
    assert "plain `brigade serve` listens on `0.0.0.0`" in readme and "`--host 127.0.0.1`" in readme
    assert "--host 0.0.0.0" in (REPO / "scripts" / "serve.sh").read_text()
    assert "address to listen on (default 0.0.0.0)" in run_cli("serve", "--help").stdout
    # /docs: FastAPI's page, whose assets come from a CDN (said in docs/server.md and --help); the schema is local
    page = httpx.get(server.url("/docs"), timeout=30)
    assert page.status_code == 200 and "cdn.jsdelivr.net" in page.text
    assert httpx.get(server.url("/openapi.json"), timeout=30).status_code == 200
    server_doc = (REPO / "docs" / "server.md").read_text()  # the README links it for the server's behaviours
    assert "cdn.jsdelivr.net" in server_doc and "--disable-fastapi-docs" in server_doc
