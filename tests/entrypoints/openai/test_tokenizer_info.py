"""GET /tokenizer_info behind ``--enable-tokenizer-info-endpoint`` (vLLM's), on a real ``brigade serve`` of SmolLM2:
the tokenizer's config with its class and chat template, and every request lm-eval's remote tokenizer
(``tokenizer_backend=remote``; ``lm_eval.utils.RemoteTokenizer``) makes, as it makes them: the info (it needs
``eos_token``), ``/tokenize`` without a model and without special tokens, ``/detokenize``, and the chat template
rendered on the client with jinja2 as lm-eval renders it, which must give the ids the server's own chat rendering
gives. lm-eval sends the API key on each of them; the tokenizer routes stay open without it, as in vLLM."""

from __future__ import annotations

import httpx
import pytest
from jinja2 import BaseLoader, Environment, StrictUndefined
from remote_server import RemoteServer
from transformers import AutoTokenizer

API_KEY = "eval-key"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def info_server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--max-model-len", "256", "--enable-tokenizer-info-endpoint",
                                      "--disable-log-requests"], api_key=API_KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def remote(info_server):
    """An HTTP session as lm-eval's RemoteTokenizer opens it: JSON content type and the Bearer key on every call."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=info_server.base_url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def test_tokenizer_info_is_the_tokenizer_config_with_its_class_and_template(remote, hf_tokenizer):
    response = remote.get("/tokenizer_info")
    assert response.status_code == 200, response.text
    info = response.json()
    assert info["tokenizer_class"] == type(hf_tokenizer).__name__
    assert (info["eos_token"], info["bos_token"], info["pad_token"]) == ("<|im_end|>", "<|im_start|>", "<|im_end|>")
    assert info["model_max_length"] == hf_tokenizer.model_max_length
    assert info["chat_template"] == hf_tokenizer.chat_template
    assert info["added_tokens_decoder"]["2"] == "<|im_end|>"
    assert not any(key.endswith("_file") for key in info), sorted(info)  # no file paths of the server


def test_lm_eval_remote_tokenizer_requests(remote, hf_tokenizer):
    info = remote.get("/tokenizer_info").json()
    text = "The quick brown fox jumps over the lazy dog."

    def encode(value: str) -> list[int]:  # RemoteTokenizer.encode
        response = remote.post("/tokenize", json={"prompt": value, "add_special_tokens": False})
        assert response.status_code == 200, response.text
        return response.json()["tokens"]

    def decode(tokens: list[int]) -> str:  # RemoteTokenizer.decode
        response = remote.post("/detokenize", json={"tokens": tokens})
        assert response.status_code == 200, response.text
        return response.json()["prompt"]

    ids = encode(text)
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert decode(ids) == text
    assert encode(info["eos_token"])[0] == hf_tokenizer.eos_token_id  # RemoteTokenizer.eos_token_id
    assert encode(info["bos_token"])[0] == hf_tokenizer.bos_token_id
    # RemoteTokenizer.apply_chat_template: lm-eval's jinja2 environment over the served template
    env = Environment(loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True)
    rendered = env.from_string(info["chat_template"]).render(messages=MESSAGES, add_generation_prompt=True)
    served = remote.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": True})
    assert served.status_code == 200, served.text
    assert encode(rendered) == served.json()["tokens"]


def test_the_tokenizer_routes_stay_open_without_the_key(info_server):
    assert httpx.get(info_server.url("/tokenizer_info")).status_code == 200
    assert httpx.post(info_server.url("/v1/completions"), json={"prompt": "Hi"}).status_code == 401


def test_no_tokenizer_info_without_the_flag(server):
    """The folder's shared server runs without the flag: the route does not exist."""
    response = httpx.get(server.url("/tokenizer_info"))
    assert response.status_code == 404 and "error" in response.json()
