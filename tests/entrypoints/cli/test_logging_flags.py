"""vLLM's logging flags on ``brigade serve``: by default no request lines and a periodic stats line (INFO while
tokens flow, then DEBUG), ``--enable-log-requests`` / ``--disable-log-stats`` / the tool-call flags, and bad
values as one line."""

from __future__ import annotations

import time

import pytest
from cli_runner import assert_one_line, parse, run_main
from cli_server import MODEL_NAME
from remote_server import RemoteServer


def _complete(server, prompt: str = "Hello") -> None:
    import httpx

    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4}
    assert httpx.post(server.url("/v1/completions"), json=body, timeout=120).status_code == 200


def _wait_for(server, needle: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while needle not in (log := server.log_tail(10**7)):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.2)
    return log


def test_by_default_requests_are_not_logged_and_stats_are(server):
    _complete(server)
    log = _wait_for(server, "Avg prompt throughput: ")
    assert "Avg generation throughput: " in log and "KV cache usage: " in log and "Prefix cache hit rate: " in log
    assert "prompt tokens, params=" not in log


def test_enable_log_requests_disable_log_stats_and_the_tool_flags(smollm2_path):
    import httpx

    srv = RemoteServer(smollm2_path, ["--served-model-name", MODEL_NAME, "--max-model-len", "512",
                                      "--enable-log-requests", "--disable-log-stats", "--enable-auto-tool-choice",
                                      "--tool-call-parser", "hermes", "--disable-fastapi-docs"],
                       env={"BRIGADE_LOG_STATS_INTERVAL": "0.5"})
    try:
        for path in ("/docs", "/redoc", "/openapi.json"):  # vLLM's --disable-fastapi-docs
            assert httpx.get(srv.url(path), timeout=30).status_code == 404, path
        _complete(srv)
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": [tool], "tool_choice": "auto", "max_tokens": 24}
        assert httpx.post(srv.url("/v1/chat/completions"), json=body, timeout=120).status_code == 200
        log = _wait_for(srv, "prompt tokens, params=SamplingParams(")
        time.sleep(1.5)  # three stats intervals
        assert "Avg prompt throughput" not in srv.log_tail(10**7)
    finally:
        srv.stop()


@pytest.mark.parametrize("argv,needle", [
    (["--tool-call-parser", "llama3_json"], "--tool-call-parser 'llama3_json' is not implemented; Brigade parses tool "
                                            "calls in one format, always on: use --tool-call-parser hermes"),
    (["--enable-log-requests", "--disable-log-requests"], "--enable-log-requests and --disable-log-requests "
                                                          "contradict each other"),
])
def test_bad_logging_and_tool_flags_are_one_line(smollm2_path, argv, needle):
    assert_one_line(run_main("serve", str(smollm2_path), *argv), "brigade serve", needle)


def test_bad_stats_interval_is_one_line(smollm2_path):
    proc = run_main("serve", str(smollm2_path), env={"BRIGADE_LOG_STATS_INTERVAL": "soon"})
    assert_one_line(proc, "brigade serve", "BRIGADE_LOG_STATS_INTERVAL='soon' is not a positive number of seconds")


def test_log_requests_flags_map_onto_the_settings(smollm2_path):
    from brigade.entrypoints.cli.serve import settings_from_args

    assert not settings_from_args(parse("serve", str(smollm2_path))).log_requests
    assert not settings_from_args(parse("serve", str(smollm2_path), "--disable-log-requests")).log_requests
    assert settings_from_args(parse("serve", str(smollm2_path), "--enable-log-requests")).log_requests
    assert not settings_from_args(parse("serve", str(smollm2_path), "--disable-log-stats")).log_stats
    help_text = run_main("serve", "--help").stdout
    assert "--disable-log-requests" in help_text and "deprecated" in help_text and "hermes" in help_text


def test_the_stats_line_is_info_while_tokens_flow_then_debug(caplog):
    from brigade.interfaces import IterationStats, SchedulerStats
    from brigade.metrics.log_stats import LoggingStatLogger

    now = [100.0]
    stats = LoggingStatLogger(clock=lambda: now[0])
    stats.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.25, prefix_cache_queries=40,
                                prefix_cache_hits=10), IterationStats(num_prompt_tokens=40, num_generation_tokens=2))
    stats.record(None, IterationStats(num_generation_tokens=8))
    caplog.set_level("DEBUG", logger="brigade.metrics")
    for _ in range(3):  # traffic, the first idle interval, then idle
        now[0] += 10.0
        stats.log()
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "DEBUG"]
    assert caplog.records[0].getMessage() == (
        "Avg prompt throughput: 4.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 2 reqs, Waiting: 1 "
        "reqs, KV cache usage: 25.0%, Prefix cache hit rate: 25.0%")
