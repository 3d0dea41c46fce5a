"""The example plugins' own code: the JSONL stat logger, the structured-text IO processor and the
reset-prefix-cache router (its API-key check and the engine call), imported from their source folders.
Their discovery through entry points is tested in test_discovery.py; the endpoint mounted in the real
server is a server test."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from brigade.config import ModelConfig
from brigade.interfaces import CompletionOutput, FinishedRequestStats, IterationStats, RequestOutput, SchedulerStats
from brigade.plugins import UnknownNameError
from brigade.plugins.io_processor import IOProcessor, get_io_processor, io_processor_name
from brigade.plugins.registry import PluginSource, Registries

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


@pytest.fixture
def example_paths(monkeypatch):
    for name in ("jsonl_stat_logger", "io_processor_example", "reset_cache_endpoint"):
        monkeypatch.syspath_prepend(str(PLUGINS / name))


def test_jsonl_stat_logger_writes_one_line_per_step(example_paths, tmp_path, monkeypatch):
    from brigade_jsonl_stat_logger.logger import JsonlStatLogger

    path = tmp_path / "stats.jsonl"
    monkeypatch.setenv("BRIGADE_STATS_JSONL", str(path))
    logger = JsonlStatLogger(config=None)
    logger.record(SchedulerStats(num_running_reqs=2, kv_cache_usage=0.25),
                  IterationStats(num_generation_tokens=2, inter_token_latencies_s=[0.01, 0.02]))
    finished = FinishedRequestStats("stop", 1.5, 7, 3, 0.2, 0.1)
    logger.record(None, IterationStats(num_prompt_tokens=7, finished_requests=[finished]))
    logger.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1]
    assert lines[0]["scheduler_stats"]["num_running_reqs"] == 2
    assert lines[0]["scheduler_stats"]["kv_cache_usage"] == 0.25
    assert lines[0]["iteration_stats"]["inter_token_latencies_s"] == [0.01, 0.02]
    assert lines[1]["scheduler_stats"] is None
    assert lines[1]["iteration_stats"]["finished_requests"][0]["finish_reason"] == "stop"


def test_jsonl_stat_logger_without_a_path_writes_nothing_and_says_so_at_debug(example_paths, monkeypatch, caplog):
    from brigade_jsonl_stat_logger.logger import JsonlStatLogger

    monkeypatch.delenv("BRIGADE_STATS_JSONL", raising=False)
    caplog.set_level(logging.DEBUG, logger="brigade_jsonl_stat_logger.logger")
    logger = JsonlStatLogger(config=None)
    logger.record(None, IterationStats())
    assert logger.num_steps == 0 and "BRIGADE_STATS_JSONL is unset" in caplog.text
    assert all(r.levelno < logging.WARNING for r in caplog.records)  # installed by setup: not a misconfiguration


def _output(prompt_ids: list[int], text: str, token_ids: list[int], reason: str) -> RequestOutput:
    return RequestOutput("r", None, prompt_ids, [CompletionOutput(0, text, token_ids, finish_reason=reason)], True)


def test_structured_text_processor_round_trip(example_paths):
    from brigade_io_processor_example.processor import StructuredTextProcessor

    processor = StructuredTextProcessor(ModelConfig(model="m"))
    request = processor.parse_request({"data": {"texts": ["Hi.", "Paris is"]},
                                       "params": {"max_tokens": 8, "temperature": 0}})
    assert request.prompts == ["Hi.", "Paris is"]
    assert (request.sampling_params.max_tokens, request.sampling_params.temperature) == (8, 0.0)
    body = processor.post_process(request, [_output([1, 2], " Hello there! How are you?", [5, 6, 7], "stop"),
                                            _output([3, 4, 5], " big. It", [8, 9], "length")])
    assert body["data"][0]["sentences"] == ["Hello there!", "How are you?"]
    assert body["data"][1] == {"input": "Paris is", "completion": " big. It", "finish_reason": "length",
                               "sentences": ["big.", "It"], "num_prompt_tokens": 3, "num_completion_tokens": 2}
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 5}


@pytest.mark.parametrize("body", [{"text": "x"}, {"data": {"text": ""}}, {"data": {"text": "a", "texts": ["b"]}},
                                  {"data": {"text": "a"}, "params": {"top_k": 3}}])
def test_structured_text_processor_rejects_malformed_bodies(example_paths, body):
    from brigade_io_processor_example.processor import StructuredTextProcessor

    with pytest.raises(ValueError):
        StructuredTextProcessor(ModelConfig(model="m")).parse_request(body)


def test_io_processor_selection_cli_wins_over_model_config(example_paths):
    registries = Registries()
    registries.io_processors.add("structured_text", "brigade_io_processor_example.processor:StructuredTextProcessor",
                                 PluginSource("structured_text", "brigade-io-processor-example", "0.1.0"))
    from_model = SimpleNamespace(io_processor_plugin="structured_text")
    assert io_processor_name(ModelConfig(model="m"), from_model) == "structured_text"
    assert io_processor_name(ModelConfig(model="m", io_processor_plugin="other"), from_model) == "other"
    assert get_io_processor(ModelConfig(model="m"), registries) is None
    processor = get_io_processor(ModelConfig(model="m"), registries, from_model)
    assert isinstance(processor, IOProcessor)
    with pytest.raises(UnknownNameError, match="installed: structured_text"):
        get_io_processor(ModelConfig(model="m", io_processor_plugin="other"), registries)


class _EngineClient:
    """Stands in for AsyncLLM: counts reset calls (the router, not the engine, is under test)."""

    def __init__(self) -> None:
        self.calls = 0

    async def reset_prefix_cache(self) -> bool:
        self.calls += 1
        return True


@pytest.mark.parametrize("api_key", [None, "s3cret"])
def test_reset_prefix_cache_router_calls_the_engine_and_honours_the_api_key(example_paths, api_key):
    import httpx
    from fastapi import FastAPI

    from brigade_reset_cache_endpoint.router import make_router

    app = FastAPI()
    app.state.engine_client = _EngineClient()
    app.state.api_key = api_key
    app.include_router(make_router(app.state))

    async def call(headers: dict[str, str]) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/admin/reset_prefix_cache", headers=headers)

    if api_key is not None:
        denied = asyncio.run(call({"Authorization": "Bearer wrong"}))
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        assert app.state.engine_client.calls == 0
    ok = asyncio.run(call({"Authorization": f"Bearer {api_key}"} if api_key else {}))
    assert ok.status_code == 200 and ok.json() == {"reset": True}
    assert app.state.engine_client.calls == 1
