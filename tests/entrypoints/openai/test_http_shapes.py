"""HTTP shapes that need an engine failing at an exact token, or a route with a bug, checked in-process on
the app built by build_app over a scripted FakeEngine (test_engine_death.py kills a real engine)."""

from __future__ import annotations

import json

import pytest
from fake_engine import FakeEngine
from fastapi.testclient import TestClient
from pydantic import BaseModel
from transformers import AutoTokenizer

from brigade.config import BrigadeConfig, ModelConfig
from brigade.entrypoints.openai.api_server import ServerSettings, build_app

QUESTION = [{"role": "user", "content": "Hi"}]


class Body(BaseModel):
    """A typed body, declared at module level so FastAPI can resolve the annotation."""

    count: int


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(str(smollm2_path))


def make_client(smollm2_path, engine: FakeEngine) -> TestClient:
    config = BrigadeConfig(model_config=ModelConfig(model=str(smollm2_path), served_model_name="fake"))
    app = build_app(engine, config, ServerSettings(log_requests=False))
    return TestClient(app, raise_server_exceptions=False)


def events(response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 5, "stream": True}),
    ("/v1/completions", {"prompt": "one two three four", "max_tokens": 5, "stream": True}),
])
def test_engine_death_mid_stream_sends_one_error_then_done(smollm2_path, tokenizer, path, body):
    engine = FakeEngine(tokenizer, die_after=2)
    client = make_client(smollm2_path, engine)
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        data = events(response)
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_unavailable" and error["param"] is None
    chunks = [json.loads(d) for d in data[:-2]]
    assert all("error" not in c for c in chunks)
    num_role_chunks = 1 if path.endswith("chat/completions") else 0
    assert len(chunks) == num_role_chunks + 2  # the two tokens made before the engine died
    assert len(engine.aborted) == 1  # the unfinished request is aborted, not left running


def test_engine_death_during_non_streamed_request_is_503(smollm2_path, tokenizer):
    client = make_client(smollm2_path, FakeEngine(tokenizer, die_after=1))
    response = client.post("/v1/completions", json={"prompt": "hi there", "max_tokens": 4})
    assert response.status_code == 503 and response.json()["error"]["code"] == "engine_unavailable"


def test_typed_routes_give_400_not_422_and_bugs_give_500(smollm2_path, tokenizer):
    client = make_client(smollm2_path, FakeEngine(tokenizer))

    # Routes declared the FastAPI way (as endpoint plugins do) go through the same handlers.
    @client.app.post("/typed")
    async def typed(body: Body) -> dict:
        return {"count": body.count}

    @client.app.get("/bug")
    async def bug() -> dict:
        raise RuntimeError("boom")

    bad = client.post("/typed", json={"count": "many"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "count" and bad.json()["error"]["type"] == "invalid_request_error"
    assert client.post("/typed", json={"count": 3}).json() == {"count": 3}
    crash = client.get("/bug")
    assert crash.status_code == 500
    assert crash.json()["error"]["type"] == "server_error" and "boom" in crash.json()["error"]["message"]


def test_stream_chunks_when_usage_not_asked_have_no_usage_key(smollm2_path, tokenizer):
    client = make_client(smollm2_path, FakeEngine(tokenizer))
    with client.stream("POST", "/v1/completions", json={"prompt": "a b c", "max_tokens": 3, "stream": True}) as r:
        data = events(r)
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]" and len(chunks) == 3
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
