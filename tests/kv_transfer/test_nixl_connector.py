"""brigade-nixl's NixlConnector on the real SmolLM2 weights, fp32 on the CPU, real NIXL (UCX on host memory) and a
real ZeroMQ side channel on loopback (vLLM's prefill/decode disaggregation).

A producer engine computes a few prompts and copies their full prompt blocks into its NIXL-registered host pool; a
separate consumer engine, with its own empty KV pool, asks the producer's side channel which blocks it holds, READs
them with NIXL and computes only each prompt's tail: its greedy tokens equal the producer's and transformers'. A
prompt sharing only part of a prefix loads only the shared whole blocks; a consumer of another block size is refused
at the handshake and computes everything; once the producer is gone the consumer warns once and computes everything,
with the same tokens. Blocks all come back and no lease is left on the producer; bad settings are one line each.
The connector comes from the installed brigade-nixl distribution through its entry point.
"""

from __future__ import annotations

import gc
import json
import logging
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from connector_plugins import assert_connector_comes_from, parse_serve

from brigade import LLM, SamplingParams
from brigade.config import ConfigError, KVTransferConfig
from brigade.entrypoints.cli.engine_args import runnable_config_from_args
from brigade.kv_transfer import KVConnectorRole, make_kv_connector
from brigade.plugins import PluginLoadError

BLOCK = 16
MAX_NEW_TOKENS = 8
TIMEOUT_S = 1.0  # the consumer's wait for the side channel: short, so the "producer gone" case costs ~1 s
ENGINE = {"dtype": "float32", "max_model_len": 256, "block_size": BLOCK, "num_gpu_blocks_override": 32}
RAW_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 4 + "Then the dog",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Water boils at",  # shorter than a block: nothing to load
]


def kv_config(role: str, port: int, **extra) -> dict:
    return {"kv_connector": "NixlConnector", "kv_role": role,
            "kv_connector_extra_config": {"port": port, "pool_blocks": 64, "timeout_s": TIMEOUT_S, **extra}}


def greedy(max_tokens: int = MAX_NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def connectors(llm: LLM):
    """(scheduler-role, worker-role) connector of an offline engine."""
    core = llm.engine.core
    return core.scheduler.kv_connector, core.executor.worker.model_runner.kv_connector


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def assert_all_blocks_free(llm: LLM) -> None:
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


def num_loadable_blocks(prompt: list[int]) -> int:
    return (len(prompt) - 1) // BLOCK  # whole blocks, at most num_tokens - 1 tokens


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def side_channel_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("brigade-nixl-side-channel")]


@pytest.fixture(scope="module")
def prompts(hf_reference) -> list[list[int]]:
    return [hf_reference.tokenizer.encode(p) for p in RAW_PROMPTS]


@pytest.fixture(scope="module")
def expected(hf_reference, prompts) -> list[list[int]]:
    return hf_reference.greedy(prompts, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def producer(smollm2_path, prompts):
    """A live producer engine that has computed ``prompts`` (its pool holds their full prompt blocks)."""
    port = unused_port()
    llm = LLM(str(smollm2_path), kv_transfer_config=kv_config("kv_producer", port), **ENGINE)
    outputs = token_ids(llm.generate(prompts, greedy(), use_tqdm=False))
    yield SimpleNamespace(llm=llm, port=port, outputs=outputs)
    llm.engine.core.shutdown()  # idempotent: the last test already shut it down
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def consumer(smollm2_path, producer):
    llm = LLM(str(smollm2_path), kv_transfer_config=kv_config("kv_consumer", producer.port), **ENGINE)
    yield llm
    llm.engine.core.shutdown()
    del llm
    gc.collect()


def test_the_connector_comes_from_the_installed_brigade_nixl_entry_point():
    assert_connector_comes_from("nixl", "brigade-nixl", "NixlConnector")


def test_the_consumer_reads_the_producers_blocks_and_matches_transformers(producer, consumer, prompts, expected):
    assert producer.outputs == expected, "the producer computes everything itself"
    p_scheduler, p_worker = connectors(producer.llm)
    distinct = {tuple(p[:BLOCK * (i + 1)]) for p in prompts for i in range(len(p) // BLOCK)}
    assert p_worker.num_saved_blocks == len(p_worker.pool) == len(distinct) > 0
    assert p_scheduler.num_matched_tokens == 0, "a producer loads nothing"
    assert_all_blocks_free(producer.llm)

    outputs = consumer.generate(prompts, greedy(), use_tqdm=False)
    assert token_ids(outputs) == expected
    assert [o.num_cached_tokens for o in outputs] == [num_loadable_blocks(p) * BLOCK for p in prompts]
    scheduler_side, worker_side = connectors(consumer)
    loadable = sum(num_loadable_blocks(p) for p in prompts) * BLOCK
    assert scheduler_side.num_matched_tokens == worker_side.num_loaded_tokens == loadable > 0
    assert worker_side.num_failed_loads == 0 and worker_side.num_saved_blocks == 0
    assert worker_side.pool is None, "a consumer has no pool"
    assert p_worker.pool.num_leases() == 0, "every lease was released after the read"
    assert_all_blocks_free(consumer)


def test_a_prompt_sharing_part_of_a_prefix_loads_only_the_shared_whole_blocks(consumer, prompts, hf_reference):
    assert consumer.reset_prefix_cache()  # so that the shared blocks come from the producer, not the local cache
    tail = hf_reference.tokenizer.encode(" and then a small cat sat on the warm mat, purring softly")
    prompt = prompts[0][:2 * BLOCK + 3] + tail  # two whole blocks in common, the third differs
    assert len(prompt) > 3 * BLOCK
    scheduler_side, worker_side = connectors(consumer)
    matched, loaded = scheduler_side.num_matched_tokens, worker_side.num_loaded_tokens
    [output] = consumer.generate([prompt], greedy(), use_tqdm=False)
    assert output.outputs[0].token_ids == hf_reference.greedy([prompt], MAX_NEW_TOKENS)[0]
    assert output.num_cached_tokens == 2 * BLOCK
    assert scheduler_side.num_matched_tokens - matched == worker_side.num_loaded_tokens - loaded == 2 * BLOCK
    assert_all_blocks_free(consumer)


def test_a_consumer_of_another_block_size_is_refused_at_the_handshake(smollm2_path, producer, prompts, expected,
                                                                       caplog):
    with caplog.at_level(logging.WARNING, logger="brigade_nixl"):
        llm = LLM(str(smollm2_path), kv_transfer_config=kv_config("kv_consumer", producer.port),
                  **{**ENGINE, "block_size": 32, "num_gpu_blocks_override": 16})
        outputs = llm.generate(prompts, greedy(4), use_tqdm=False)
    assert token_ids(outputs) == [t[:4] for t in expected]
    assert [o.num_cached_tokens for o in outputs] == [0] * len(prompts)
    scheduler_side, worker_side = connectors(llm)
    assert scheduler_side.num_matched_tokens == 0 and worker_side.num_loaded_tokens == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "handshake" in warnings[0] and "KV layout mismatch" in warnings[0], warnings
    assert "block_size=16" in warnings[0] and "block_size=32" in warnings[0]
    assert_all_blocks_free(llm)
    llm.engine.core.shutdown()
    del llm, scheduler_side, worker_side
    gc.collect()


@pytest.mark.parametrize("extra,expected", [
    ({"pool_size": 1}, "has unknown keys ['pool_size'] for NixlConnector; allowed: host, port, pool_blocks, "
                       "backends, timeout_s"),
    ({"port": 0}, "port must be a TCP port number (an int from 1 to 65535), got 0"),
    ({"port": "5570"}, "port must be a TCP port number (an int from 1 to 65535), got '5570'"),
    ({"pool_blocks": 0}, "pool_blocks must be a positive int (KV blocks in the producer's host pool), got 0"),
    ({"pool_blocks": True}, "pool_blocks must be a positive int (KV blocks in the producer's host pool), got True"),
    ({"timeout_s": -1}, "timeout_s must be a positive number of seconds, got -1"),
    ({"backends": "UCX"}, "backends must be a non-empty list of NIXL backend names"),
    ({"host": ""}, "host must be a host name or IPv4 address (a non-empty string), got ''"),
])
def test_bad_connector_settings_are_one_line(smollm2_path, extra, expected):
    raw = '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": %s}'
    with pytest.raises(ConfigError) as info:
        runnable_config_from_args(parse_serve(smollm2_path, raw % json.dumps(extra)))
    message = str(info.value)
    assert expected in message and "\n" not in message
    assert message.startswith("--kv-transfer-config kv_connector_extra_config ")


def test_a_producer_port_in_use_is_one_line(producer):
    """A second producer on the first one's port: the worker-role connector fails to start, in one line."""
    _, p_worker = connectors(producer.llm)
    config = KVTransferConfig("NixlConnector", "kv_producer", {"port": producer.port, "pool_blocks": 2})
    with pytest.raises(PluginLoadError) as info:
        make_kv_connector(config, KVConnectorRole.WORKER, p_worker.layout)
    message = str(info.value)
    assert f"port {producer.port}" in message and "in use" in message and "\n" not in message, message
    assert side_channel_threads() == [f"brigade-nixl-side-channel-{producer.port}"]


def test_once_the_producer_is_gone_the_consumer_warns_and_computes_everything(producer, consumer, prompts,
                                                                                expected, caplog):
    from brigade_nixl.connector import NixlConnectorMetadata, RequestLoad
    from brigade_nixl.side_channel import SideChannelServer

    producer.llm.engine.core.shutdown()
    assert side_channel_threads() == [], "the side channel's thread outlived the engine"
    SideChannelServer("127.0.0.1", producer.port, dict).close()  # the port is free again for a new producer
    assert consumer.reset_prefix_cache()
    scheduler_side, worker_side = connectors(consumer)
    matched, loaded = scheduler_side.num_matched_tokens, worker_side.num_loaded_tokens
    with caplog.at_level(logging.WARNING, logger="brigade_nixl"):
        outputs = consumer.generate(prompts, greedy(), use_tqdm=False)
    assert token_ids(outputs) == expected
    assert [o.num_cached_tokens for o in outputs] == [0] * len(prompts)
    assert (scheduler_side.num_matched_tokens, worker_side.num_loaded_tokens) == (matched, loaded)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"producer at 127.0.0.1:{producer.port} cannot be used" in warnings[0], warnings
    assert_all_blocks_free(consumer)

    # A read the scheduler planned while the producer was up, run once it is gone (the worker re-handshakes with
    # a producer it has not met): reported as failed, so the runner computes those tokens; one WARNING.
    caplog.clear()
    failed = worker_side.num_failed_loads
    load = RequestLoad("late-read", 0, [0], [0], "a-restarted-producer", 1, time.monotonic() + 60)
    with caplog.at_level(logging.WARNING, logger="brigade_nixl"):
        worker_side.start_load_kv(NixlConnectorMetadata(loads=[load]), [])
    assert worker_side.wait_for_load() == {"late-read": 0}
    assert worker_side.num_failed_loads == failed + 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "request late-read computes its 16 tokens from token 0" in warnings[0], warnings
