"""The IO-processor plugin (brigade-io-processor-example, pip-installed) over real HTTP: POST /pooling
exists only when --io-processor-plugin selects it, and returns the plugin's response built from real
greedy outputs of SmolLM2."""

from __future__ import annotations

import httpx
from remote_server import RemoteServer


def test_pooling_route_runs_the_selected_io_processor(smollm2_path):
    server = RemoteServer(smollm2_path, ["--max-model-len", "256", "--io-processor-plugin", "structured_text"])
    try:
        body = {"data": {"texts": ["The capital of France is", "Water boils at"]},
                "params": {"max_tokens": 8, "temperature": 0.0}}
        response = httpx.post(server.url("/pooling"), json=body, timeout=120)
        assert response.status_code == 200, response.text
        result = response.json()
        assert [item["input"] for item in result["data"]] == body["data"]["texts"]
        first = result["data"][0]
        assert first["completion"].startswith(" Paris."), first
        assert first["sentences"][0] == "Paris."
        assert first["num_completion_tokens"] == 8 and first["finish_reason"] == "length"
        bad = httpx.post(server.url("/pooling"), json={"data": {"text": ""}}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "data"
    finally:
        server.stop()


def test_no_pooling_route_without_an_io_processor(server):
    """The folder's shared server (conftest.py), started without --io-processor-plugin."""
    assert "--io-processor-plugin" not in server.proc.args
    response = httpx.post(server.url("/pooling"), json={"data": {"text": "hi"}}, timeout=30)
    assert response.status_code == 404 and "error" in response.json()
