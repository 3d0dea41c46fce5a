"""MODEL as a hub id, through the ``brigade`` command: offline (``HF_HUB_OFFLINE=1``) or with the hub unreachable it
is refused in one line saying how to fetch it (``hf download``); with a hub (a local fake of the Hugging Face API,
serving a tiny random Llama with SmolLM2's tokenizer), it is downloaded into the cache with a progress bar, then
found there offline; a directory that is no model says so."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_runner import assert_one_line, run_cli

from brigade.entrypoints.model_hub import is_hub_id

REPO = "brigade-test/SmolLM2-135M-Instruct"
SHA = "0123456789abcdef0123456789abcdef01234567"


def test_what_reads_as_a_hub_id():
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert is_hub_id(name), name
    for name in ("./model", "/models/x", "~/x", "a/b/c", "models/", "x/../y", ""):
        assert not is_hub_id(name), name


def test_offline_a_hub_id_is_refused_in_one_line_naming_hf_download(tmp_path):
    proc = run_cli("serve", REPO, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    line = assert_one_line(proc, "brigade serve", "HF_HUB_OFFLINE=1")
    assert f"hf download {REPO} --local-dir DIR" in line, line


def test_an_unreachable_hub_is_refused_in_one_line_with_the_reason(tmp_path):
    env = {"HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9"}
    line = assert_one_line(run_cli("generate", "Hi", REPO, env=env), "brigade generate", "cannot be reached", status=2)
    assert "Connection refused" in line and f"hf download {REPO}" in line, line


def test_a_directory_without_config_json_is_not_a_model_directory(tmp_path):
    assert_one_line(run_cli("serve", str(tmp_path)), "brigade serve", "is not a model directory")


class _FakeHub(BaseHTTPRequestHandler):
    """The few Hub API routes ``snapshot_download`` uses, for one repository whose files are in ``root``."""

    root: Path

    def log_message(self, *args) -> None:  # quiet
        pass

    def _files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def _json(self, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _file(self, head: bool) -> None:
        name = self.path.split(f"/resolve/{SHA}/", 1)[1]
        path = self.root / name
        if not path.is_file():
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", SHA)
        self.send_header("ETag", f'"{hashlib.sha1(name.encode()).hexdigest()}"')
        self.send_header("Content-Length", str(path.stat().st_size))
        self.end_headers()
        if not head:
            self.wfile.write(path.read_bytes())

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._file(head=True)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path.startswith(f"/api/models/{REPO}/tree/"):
            self._json([{"type": "file", "path": str(p.relative_to(self.root)), "size": p.stat().st_size,
                         "oid": hashlib.sha1(p.name.encode()).hexdigest()} for p in self._files()])
        elif path.startswith(f"/api/models/{REPO}"):
            self._json({"id": REPO, "modelId": REPO, "sha": SHA,
                        "siblings": [{"rfilename": str(p.relative_to(self.root))} for p in self._files()]})
        elif f"/resolve/{SHA}/" in path:
            self._file(head=False)
        else:
            self.send_error(404)


@pytest.fixture(scope="module")
def tiny_repo(smollm2_path, tmp_path_factory) -> Path:
    """A two-layer Llama with random weights and SmolLM2's tokenizer: a hub repository of a few MB."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("repo")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def fake_hub(tiny_repo):
    handler = type("Hub", (_FakeHub,), {"root": tiny_repo})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_hub_id_is_downloaded_into_the_cache_and_generates(fake_hub, tmp_path):
    env = {"HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path), "HF_ENDPOINT": fake_hub,
           "HF_HUB_DISABLE_PROGRESS_BARS": "0"}
    proc = run_cli("generate", "The capital of France is", REPO, "--max-tokens", "2", "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["token_ids"]) == 2, proc.stdout
    assert f"MODEL '{REPO}' is not a local directory: fetching it from {fake_hub}" in proc.stderr
    assert "Fetching" in proc.stderr  # huggingface_hub's progress bar
    snapshot = tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / SHA
    assert (snapshot / "config.json").is_file() and (snapshot / "model.safetensors").is_file()
    # Now in the cache, offline is fine: the model resolves and its flags pass; a taken port then stops serve.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        again = run_cli("serve", REPO, "--host", "127.0.0.1", "--port", str(busy.getsockname()[1]),
                        env={**env, "HF_HUB_OFFLINE": "1"})
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert again.stderr.splitlines()[-1].startswith("brigade serve: error: cannot listen on"), again.stderr


def test_setup_doc_shows_hf_download():
    setup = (Path(__file__).resolve().parents[3] / "docs" / "setup.md").read_text()
    assert "hf download" in setup and "--local-dir" in setup
