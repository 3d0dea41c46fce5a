"""brigade-shm's SharedMemoryConnector on the real SmolLM2 weights, fp32 on the CPU (vLLM's prefill/decode
disaggregation through a KV connector).

A producer engine prefills a few prompts (max_tokens=1) and saves their full prompt blocks to a store; a separate
consumer engine, with its own empty KV pool, then loads them and computes only each prompt's tail, and its greedy
tokens equal transformers' and those of an engine without connector. Blocks all come back on both sides, the
consumer's prefix cache still works afterwards, a truncated or corrupt stored file is a warning naming it (and the
tokens stay right), a store of another block size or dtype is not used, and bad --kv-transfer-config values are
one line each. The connector comes from the installed brigade-shm distribution through its entry point.
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from connector_plugins import assert_connector_comes_from, parse_serve

from brigade import LLM, SamplingParams
from brigade.config import ConfigError
from brigade.entrypoints.cli.engine_args import runnable_config_from_args
from brigade.kv_transfer import KVCacheLayout

BLOCK = 16
MAX_NEW_TOKENS = 12
ENGINE = {"dtype": "float32", "max_model_len": 512, "block_size": BLOCK, "num_gpu_blocks_override": 64}
RAW_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 4 + "Then the dog",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Water boils at",  # shorter than a block: nothing to load
]
CHAT_PROMPTS = ["What is the capital of France?", "Explain what a hash table is in two sentences."]  # shared prefix


def kv_config(role: str, path: Path) -> dict:
    return {"kv_connector": "SharedMemoryConnector", "kv_role": role, "kv_connector_extra_config": {"path": str(path)}}


def greedy(max_tokens: int = MAX_NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def connectors(llm: LLM):
    """(scheduler-role, worker-role) connector of an offline engine."""
    core = llm.engine.core
    return core.scheduler.kv_connector, core.executor.worker.model_runner.kv_connector


def assert_all_blocks_free(llm: LLM) -> None:
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


def num_loadable_blocks(prompt: list[int]) -> int:
    return (len(prompt) - 1) // BLOCK  # whole blocks, at most num_tokens - 1 tokens


@pytest.fixture(scope="module")
def prompts(hf_reference) -> list[list[int]]:
    tok = hf_reference.tokenizer
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False)
            for p in CHAT_PROMPTS]
    return [tok.encode(p) for p in RAW_PROMPTS] + chat


@pytest.fixture(scope="module")
def expected(hf_reference, prompts) -> list[list[int]]:
    return hf_reference.greedy(prompts, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path, prompts):
    """The producer's run: its store directory, and what it reported (the engine is gone afterwards)."""
    path = tmp_path_factory.mktemp("kv") / "store"  # created by the connector
    producer = LLM(str(smollm2_path), kv_transfer_config=kv_config("kv_producer", path), **ENGINE)
    outputs = producer.generate(prompts, greedy(1), use_tqdm=False)
    scheduler_side, worker_side = connectors(producer)
    info = SimpleNamespace(path=path, first_tokens=[o.outputs[0].token_ids for o in outputs],
                           num_saved_blocks=worker_side.num_saved_blocks, layout=worker_side.layout,
                           num_matched_tokens=scheduler_side.num_matched_tokens,
                           stats=producer.get_kv_cache_stats())
    del producer, scheduler_side, worker_side
    gc.collect()
    return info


@pytest.fixture(scope="module")
def consumer(smollm2_path, store):
    llm = LLM(str(smollm2_path), kv_transfer_config=kv_config("kv_consumer", store.path), **ENGINE)
    yield llm
    del llm
    gc.collect()


def test_the_connector_comes_from_the_installed_brigade_shm_entry_point():
    assert_connector_comes_from("shm", "brigade-shm", "SharedMemoryConnector")


def test_the_producer_saves_each_distinct_full_prompt_block_once(store, prompts, expected):
    assert [t[:1] for t in expected] == store.first_tokens
    distinct = {tuple(p[:BLOCK * (i + 1)]) for p in prompts for i in range(len(p) // BLOCK)}
    files = [f for f in os.listdir(store.path) if f.endswith(".safetensors")]
    assert store.num_saved_blocks == len(files) == len(distinct) > len(prompts)
    assert not [f for f in os.listdir(store.path) if f.endswith(".tmp")], "a temporary file was left behind"
    assert store.num_matched_tokens == 0, "a producer loads nothing"
    assert store.stats["num_free_blocks"] == store.stats["num_total_blocks"], "the producer leaked KV blocks"
    assert oct(os.stat(store.path).st_mode & 0o777) == oct(0o700)


def test_the_consumer_computes_only_the_tails_and_matches_transformers(smollm2_path, consumer, prompts, expected,
                                                                         store):
    outputs = consumer.generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [num_loadable_blocks(p) * BLOCK for p in prompts]
    scheduler_side, worker_side = connectors(consumer)
    # The chat prompts share their first blocks: the first one loads them, the second hits them locally.
    distinct = {tuple(p[:BLOCK * (i + 1)]) for p in prompts for i in range(num_loadable_blocks(p))}
    assert scheduler_side.num_matched_tokens == worker_side.num_loaded_tokens == len(distinct) * BLOCK
    assert worker_side.num_failed_loads == 0 and worker_side.num_saved_blocks == 0
    assert_all_blocks_free(consumer)

    plain = LLM(str(smollm2_path), **ENGINE)  # an engine without connector, for the record
    assert [o.outputs[0].token_ids for o in plain.generate(prompts, greedy(), use_tqdm=False)] == expected
    assert connectors(plain) == (None, None)
    del plain
    gc.collect()


def test_prefix_caching_still_works_on_the_consumer(consumer, prompts, expected):
    scheduler_side, _ = connectors(consumer)
    matched = scheduler_side.num_matched_tokens
    outputs = consumer.generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [num_loadable_blocks(p) * BLOCK for p in prompts]
    assert scheduler_side.num_matched_tokens == matched, "local prefix hits come first: nothing more is loaded"
    assert_all_blocks_free(consumer)


def test_a_consumer_with_a_worker_process_and_overlapped_steps(smollm2_path, store, prompts, expected):
    """The metadata crosses the pipe to the worker process, the layout comes back from it (the multiprocess
    executor), and loads work with overlapped (async) scheduling."""
    llm = LLM(str(smollm2_path), kv_transfer_config=kv_config("kv_consumer", store.path),
              distributed_executor_backend="mp", async_scheduling=True, **ENGINE)
    outputs = llm.generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [num_loadable_blocks(p) * BLOCK for p in prompts]
    assert llm.engine.core.scheduler.kv_connector.num_matched_tokens > 0
    assert_all_blocks_free(llm)
    llm.engine.core.shutdown()
    del llm
    gc.collect()


def test_a_truncated_or_corrupt_stored_block_is_a_warning_and_the_tokens_stay_right(consumer, prompts, expected,
                                                                                   caplog):
    scheduler_side, worker_side = connectors(consumer)
    assert consumer.reset_prefix_cache()
    store = scheduler_side.store
    truncated, corrupt = [], []
    for target, prompt in ((truncated, prompts[0]), (corrupt, prompts[1])):
        keys: list[str] = []
        store.extend_keys(keys, prompt)
        target.append(store.path(keys[0]))
    with open(truncated[0], "r+b") as f:
        f.truncate(os.path.getsize(truncated[0]) // 2)
    with open(corrupt[0], "r+b") as f:  # same size, one data byte flipped: only the CRC-32 can tell
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    failed = worker_side.num_failed_loads
    with caplog.at_level(logging.WARNING, logger="brigade_shm"):
        outputs = consumer.generate(prompts, greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert worker_side.num_failed_loads == failed + 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for path, reason in ((truncated[0], "unreadable"), (corrupt[0], "CRC-32 mismatch")):
        assert any(path in w and reason in w for w in warnings), warnings
        assert not os.path.exists(path), "an unusable entry is removed"
    assert_all_blocks_free(consumer)


@pytest.mark.parametrize("other", [{"block_size": 32}, {"dtype": "bfloat16"}], ids=["block_size", "dtype"])
def test_a_store_of_another_block_size_or_dtype_is_not_used(smollm2_path, store, prompts, expected, other):
    llm = LLM(str(smollm2_path), kv_transfer_config=kv_config("kv_consumer", store.path), **{**ENGINE, **other})
    outputs = llm.generate(prompts, greedy(4), use_tqdm=False)
    if "dtype" not in other:  # bf16 tokens may differ from fp32 transformers'
        assert [o.outputs[0].token_ids for o in outputs] == [t[:4] for t in expected]
    scheduler_side, worker_side = connectors(llm)
    assert scheduler_side.layout.dtype == other.get("dtype", "float32")
    assert scheduler_side.num_matched_tokens == 0 and worker_side.num_loaded_tokens == 0
    assert_all_blocks_free(llm)
    del llm, scheduler_side, worker_side
    gc.collect()


def test_a_block_of_another_dtype_is_neither_found_nor_loaded(tmp_path, store):
    """Another dtype is another layout: its keys differ, and its file put under this layout's name is refused."""
    from brigade_shm.store import KVBlockStore, StoreEntryError

    ours = KVBlockStore(str(tmp_path), store.layout)
    bf16 = KVBlockStore(str(tmp_path), KVCacheLayout(**{**vars_of(store.layout), "dtype": "bfloat16"}))
    tokens = list(range(3 * BLOCK))
    our_keys, their_keys = [], []
    ours.extend_keys(our_keys, tokens)
    bf16.extend_keys(their_keys, tokens)
    assert len(our_keys) == 3 and not set(our_keys) & set(their_keys)
    assert bf16.write(their_keys[0], torch.zeros(bf16.shape, dtype=torch.bfloat16))
    assert not ours.contains(our_keys[0])
    os.replace(bf16.path(their_keys[0]), ours.path(our_keys[0]))
    with pytest.raises(StoreEntryError, match="made for another layout"):
        ours.read(our_keys[0])


def vars_of(layout: KVCacheLayout) -> dict:
    return {name: getattr(layout, name) for name in layout.__dataclass_fields__}


@pytest.mark.parametrize("extra,expected", [
    ({"path": "FILE"}, "kv_connector_extra_config path '{FILE}' is not a directory"),
    ({"path": "/no/such/parent/store"}, "path '/no/such/parent/store' does not exist and neither does its parent"),
    ({"path": 3}, "path must be a directory path (a non-empty string), got 3"),
    ({"size_gib": 1}, "has unknown keys ['size_gib'] for SharedMemoryConnector; allowed: path"),
])
def test_bad_connector_settings_are_one_line(smollm2_path, tmp_path, extra, expected):
    file = tmp_path / "not-a-dir"
    file.write_text("")
    extra = {k: (str(file) if v == "FILE" else v) for k, v in extra.items()}
    raw = '{"kv_connector": "SharedMemoryConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": %s}'
    import json

    with pytest.raises(ConfigError) as info:
        runnable_config_from_args(parse_serve(smollm2_path, raw % json.dumps(extra)))
    message = str(info.value)
    assert expected.replace("{FILE}", str(file)) in message and "\n" not in message


def test_good_settings_pass_and_an_unknown_connector_is_one_line(smollm2_path, tmp_path):
    config = runnable_config_from_args(parse_serve(smollm2_path, '{"kv_connector": "SharedMemoryConnector", '
                                                   f'"kv_role": "kv_producer", "kv_connector_extra_config": '
                                                   f'{{"path": "{tmp_path / "new"}"}}}}'))
    assert config.kv_transfer_config.kv_role == "kv_producer" and not (tmp_path / "new").exists()
    with pytest.raises(ConfigError, match=r"^--kv-transfer-config kv_connector 'nixl' is not installed; "
                                          r"installed: .*SharedMemoryConnector"):
        runnable_config_from_args(parse_serve(smollm2_path, '{"kv_connector": "nixl"}'))
    with pytest.raises(ConfigError, match=r"^--kv-transfer-config kv_connector 'nixl' is not installed"):
        LLM(str(smollm2_path), kv_transfer_config={"kv_connector": "nixl"})
