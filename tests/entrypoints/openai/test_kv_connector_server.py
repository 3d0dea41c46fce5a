"""Prefill/decode disaggregation through two real ``brigade serve`` processes on loopback (brigade-shm's
SharedMemoryConnector), driven with the official ``openai`` client: the producer server computes a chat
prompt and stores its KV blocks; the consumer server, with its own empty KV pool, loads them (reported as
``usage.prompt_tokens_details.cached_tokens``) and gives transformers' greedy text, streaming included."""

from __future__ import annotations

import json

import pytest
from remote_server import RemoteServer

NAME = "smollm2"
MESSAGES = [{"role": "user", "content": "Explain in two sentences what a hash table is and why lookups are fast."}]
ENGINE = ["--served-model-name", NAME, "--max-model-len", "512", "--block-size", "16", "--num-gpu-blocks-override",
          "64"]


def _server(model, role: str, path) -> RemoteServer:
    config = {"kv_connector": "SharedMemoryConnector", "kv_role": role,
              "kv_connector_extra_config": {"path": str(path)}}
    return RemoteServer(model, [*ENGINE, "--kv-transfer-config", json.dumps(config)])


@pytest.fixture(scope="module")
def servers(smollm2_path, tmp_path_factory):
    store = tmp_path_factory.mktemp("kv-store")
    producer = _server(smollm2_path, "kv_producer", store)
    try:
        consumer = _server(smollm2_path, "kv_consumer", store)
    except BaseException:
        producer.stop()
        raise
    yield producer, consumer, store
    consumer.stop()
    producer.stop()


def test_the_consumer_server_loads_the_producer_servers_blocks(servers, hf_reference):
    producer, consumer, store = servers
    tok = hf_reference.tokenizer
    prompt_ids = tok.encode(tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)
    full_blocks = (len(prompt_ids) - 1) // 16  # whole blocks, the prompt's last token always computed
    assert full_blocks >= 2
    expected = tok.decode(hf_reference.greedy([prompt_ids], 16)[0], skip_special_tokens=True)

    first = producer.openai_client().chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=1,
                                                             temperature=0)
    assert first.usage.prompt_tokens == len(prompt_ids)
    assert len([f for f in store.iterdir() if f.is_file()]) >= full_blocks

    client = consumer.openai_client()
    out = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=16, temperature=0)
    assert out.choices[0].message.content == expected
    assert out.usage.prompt_tokens_details.cached_tokens == 16 * full_blocks
    # Streaming, a second time: now the consumer's own prefix cache serves the same blocks.
    stream = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 16 * full_blocks
