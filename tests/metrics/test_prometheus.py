"""PrometheusStatLogger: step statistics in, ``brigade:`` exposition text out, one registry per logger."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from brigade.interfaces import FinishedRequestStats, IterationStats, SchedulerStats
from brigade.metrics.prometheus import PrometheusStatLogger


ENGINE_0 = (("engine", "0"),)


def samples(logger: PrometheusStatLogger) -> dict[tuple[str, tuple], float]:
    body, content_type = logger.render()
    assert content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
    return out


def test_records_gauges_counters_and_histograms():
    logger = PrometheusStatLogger("m")
    logger.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, prefix_cache_queries=40, prefix_cache_hits=16,
                                 num_preemptions=1, num_free_blocks=30, num_total_blocks=40),
                  IterationStats(num_prompt_tokens=40, num_generation_tokens=3, time_to_first_tokens_s=[0.2],
                                 inter_token_latencies_s=[0.05, 0.07],
                                 finished_requests=[FinishedRequestStats("stop", 1.5, 40, 5, 0.2, 0.3)]))
    logger.record(None, IterationStats(num_generation_tokens=2,
                                       finished_requests=[FinishedRequestStats("length", 2.0, 4, 1, 0.1, None)]))
    s = samples(logger)
    assert s[("brigade:num_requests_running", ENGINE_0)] == 3 and s[("brigade:num_requests_waiting", ENGINE_0)] == 2
    assert s[("brigade:kv_cache_usage_perc", ENGINE_0)] == 0.25 and s[("brigade:num_free_blocks", ENGINE_0)] == 30
    assert s[("brigade:prefix_cache_queries_total", ENGINE_0)] == 40 and s[("brigade:prefix_cache_hits_total", ENGINE_0)] == 16
    assert s[("brigade:prompt_tokens_total", ())] == 40 and s[("brigade:generation_tokens_total", ())] == 5
    assert s[("brigade:num_preemptions_total", ENGINE_0)] == 1
    assert s[("brigade:request_success_total", (("finished_reason", "stop"),))] == 1
    assert s[("brigade:request_success_total", (("finished_reason", "length"),))] == 1
    assert s[("brigade:request_success_total", (("finished_reason", "abort"),))] == 0
    assert s[("brigade:time_to_first_token_seconds_count", ())] == 1
    assert s[("brigade:inter_token_latency_seconds_sum", ())] == 0.05 + 0.07
    assert s[("brigade:e2e_request_latency_seconds_count", ())] == 2
    assert s[("brigade:request_time_per_output_token_seconds_count", ())] == 1  # None tpot is not observed
    assert s[("brigade:time_to_first_token_seconds_bucket", (("le", "0.25"),))] == 1
    assert s[("brigade:time_to_first_token_seconds_bucket", (("le", "0.1"),))] == 0
    assert not any(name.endswith("_created") for name, _ in s)  # no creation-time series beside each counter


def test_direct_block_refresh_and_separate_registries():
    a, b = PrometheusStatLogger("a"), PrometheusStatLogger("b")  # no clash: each has its own registry
    a.set_kv_cache_blocks(num_free_blocks=10, num_total_blocks=10)
    b.set_kv_cache_blocks(num_free_blocks=0, num_total_blocks=8)
    assert samples(a)[("brigade:kv_cache_usage_perc", ENGINE_0)] == 0.0
    assert samples(b)[("brigade:kv_cache_usage_perc", ENGINE_0)] == 1.0
    assert b'model_name="a"' in a.render()[0] and b'model_name="a"' not in b.render()[0]


def test_engine_series_are_per_data_parallel_engine():
    """Each engine's SchedulerStats go to its own ``engine`` series; the front end's counters stay totals."""
    logger = PrometheusStatLogger("m", num_engines=2)
    assert samples(logger)[("brigade:num_requests_running", (("engine", "1"),))] == 0  # exists before any step
    logger.record(SchedulerStats(num_running_reqs=3, prefix_cache_queries=10, num_free_blocks=5, num_total_blocks=10,
                                 engine_index=1), IterationStats(num_generation_tokens=3))
    logger.record(SchedulerStats(num_running_reqs=1, prefix_cache_queries=4, num_free_blocks=10, num_total_blocks=10),
                  IterationStats(num_generation_tokens=2))
    s = samples(logger)
    assert s[("brigade:num_requests_running", ENGINE_0)] == 1
    assert s[("brigade:num_requests_running", (("engine", "1"),))] == 3
    assert s[("brigade:kv_cache_usage_perc", ENGINE_0)] == 0.0
    assert s[("brigade:kv_cache_usage_perc", (("engine", "1"),))] == 0.5
    assert s[("brigade:prefix_cache_queries_total", (("engine", "1"),))] == 10
    assert s[("brigade:generation_tokens_total", ())] == 5
