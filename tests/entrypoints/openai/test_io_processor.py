"""Without --io-processor-plugin there is no POST /pooling (the route the example IO-processor plugin serves when
selected: test_pooling_reliability.py runs it on real greedy outputs of SmolLM2)."""

from __future__ import annotations

import httpx


def test_no_pooling_route_without_an_io_processor(server):
    """The folder's shared server (conftest.py), started without --io-processor-plugin."""
    assert "--io-processor-plugin" not in server.proc.args
    response = httpx.post(server.url("/pooling"), json={"data": {"text": "hi"}}, timeout=30)
    assert response.status_code == 404 and "error" in response.json()
