"""A plugin package with bugs (tests/plugins/fixtures/faulty_processor), really pip-installed in a fresh venv, under
a real ``brigade serve`` (SmolLM2):

- its logits processor raising in ``apply()`` fails only the request that enabled it (a 500 naming the plugin,
  an error event ending a stream), and the engine and the server go on; its ``validate()`` raising a KeyError is
  a 500 naming the plugin;
- its endpoint routing a method and path the server serves stops start-up in one line naming it.
"""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from plugin_env import FIXTURES, PluginVenv, make_venv
from remote_server import RemoteServer, error_of, find_free_port

MODEL = "smollm2"
SERVE_ARGS = ["--served-model-name", MODEL, "--max-model-len", "256", "--num-gpu-blocks-override", "64",
              "--max-num-seqs", "4", "--disable-log-requests"]
PLUGIN = "plugin 'faulty_processor' (brigade-fixture-faulty-processor 0.1.0)"
CONTINUED = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a"}]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> PluginVenv:
    venv = make_venv(tmp_path_factory.mktemp("faulty-plugin-venv"))
    venv.install(FIXTURES / "faulty_processor")
    return venv


def brigade(venv: PluginVenv) -> list[str]:
    return [venv.python, "-m", "brigade.entrypoints.cli.main"]


@pytest.fixture(scope="module")
def server(venv, smollm2_path):
    srv = RemoteServer(smollm2_path, SERVE_ARGS, command=brigade(venv), env=venv.env())
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0, **fields}


# ---- a logits-processor plugin that raises ------------------------------------------------------------

def test_a_processor_raising_in_apply_fails_only_its_request(http, server):
    error = error_of(http.post("/v1/completions", json=completion(vllm_xargs={"faulty": "apply"})), 500)
    assert error["type"] == "server_error", error
    assert error["message"] == (f"logits processor 'faulty' from {PLUGIN} raised in apply(): RuntimeError: the "
                                "faulty processor broke on purpose"), error
    chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": CONTINUED, "max_tokens": 2,
                                                    "vllm_xargs": {"faulty": "apply"}})
    assert "raised in apply()" in error_of(chat, 500)["message"]
    # The engine lives: the server answers healthy and serves the same prompt without the plugin's argument.
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/completions", json=completion())
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text
    assert server.proc.poll() is None


def test_a_processor_raising_in_apply_ends_a_stream_with_an_error_event(http):
    with http.stream("POST", "/v1/completions", json=completion(stream=True, vllm_xargs={"faulty": "apply"})) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events and "error" in events[-1], events
    assert events[-1]["error"]["message"].startswith(f"logits processor 'faulty' from {PLUGIN} raised in apply()")
    assert http.post("/v1/completions", json=completion()).status_code == 200


def test_a_processor_whose_validate_raises_a_key_error_is_a_500_naming_it(http):
    error = error_of(http.post("/v1/completions", json=completion(vllm_xargs={"faulty": "validate"})), 500)
    assert error["message"] == (f"logits processor 'faulty' from {PLUGIN} raised in validate(): "
                                "KeyError: 'no_such_setting'"), error
    assert "internal server error" not in error["message"]


# ---- an endpoint plugin that collides with a core route (its own short-lived server) ------------------

def test_an_endpoint_plugin_shadowing_a_core_route_stops_start_up(venv, smollm2_path):
    cmd = [*brigade(venv), "serve", str(smollm2_path), "--host", "127.0.0.1", "--port", str(find_free_port()),
           *SERVE_ARGS]
    proc = subprocess.run(cmd, env=venv.env({"BRIGADE_ENDPOINT_PLUGINS": "shadow_completions"}),
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("brigade serve: error: endpoint 'shadow_completions' from plugin 'shadow_completions' "
                    "(brigade-fixture-faulty-processor 0.1.0) routes POST /v1/completions, which the server already "
                    "serves; an endpoint plugin may only add new routes"), last
