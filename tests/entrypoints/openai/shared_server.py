"""The ``brigade serve`` that the OpenAI-server tests share (the ``server`` fixture of this folder's conftest), and
the request bodies and response checks the files using it have in common."""

from __future__ import annotations

from pathlib import Path

import httpx
from remote_server import RemoteServer

MODEL = "smollm2"
ALIAS = "smol-alias"  # the second name the model is served under
MAX_MODEL_LEN = 512
QUESTION = [{"role": "user", "content": "Hi"}]
CONTINUED = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a"}]


def start_server(model: Path) -> RemoteServer:
    """SmolLM2 served as ``MODEL`` and ``ALIAS``, ``MAX_MODEL_LEN`` tokens, 96 KV blocks, 4 sequences, no request
    log lines."""
    return RemoteServer(model, ["--served-model-name", MODEL, ALIAS, "--max-model-len", str(MAX_MODEL_LEN),
                                "--num-gpu-blocks-override", "96", "--max-num-seqs", "4", "--disable-log-requests"])


def assert_400(response: httpx.Response, param: str | None) -> dict:
    """A 400 invalid_request_error in OpenAI's shape naming ``param``; returns the error object."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "temperature": 0, **fields}


def tokenize(http: httpx.Client, **fields) -> list[int]:
    response = http.post("/tokenize", json={"model": MODEL, **fields})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0, **fields}


def assert_openai_400(info, param: str) -> dict:
    """The refusal is a 400 invalid_request_error in OpenAI's shape naming ``param``; returns the error."""
    error = info.value.body
    assert info.value.status_code == 400 and set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


def assert_still_serving(client) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert out.choices[0].finish_reason in ("length", "stop")
