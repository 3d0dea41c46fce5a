"""Speculative decoding counters in Prometheus (vLLM's spec_decode_* names with the brigade: prefix)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from brigade.interfaces import IterationStats, SchedulerStats, SpecDecodingStats
from brigade.metrics.prometheus import PrometheusStatLogger


def samples(logger: PrometheusStatLogger) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(logger.render()[0].decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
    return out


def test_spec_decode_counters():
    logger = PrometheusStatLogger("m", num_speculative_tokens=3)
    for per_pos, accepted in (([2, 1, 0], 3), ([1, 1, 1], 3)):
        logger.record(SchedulerStats(spec_decoding=SpecDecodingStats(
            num_spec_tokens=3, num_drafts=2, num_draft_tokens=6, num_accepted_tokens=accepted,
            num_accepted_tokens_per_pos=per_pos)), IterationStats())
    logger.record(SchedulerStats(), IterationStats())  # a step without speculation stats
    s = samples(logger)
    assert s[("brigade:spec_decode_num_drafts_total", ())] == 4
    assert s[("brigade:spec_decode_num_draft_tokens_total", ())] == 12
    assert s[("brigade:spec_decode_num_accepted_tokens_total", ())] == 6
    assert [s[("brigade:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
            for i in range(3)] == [3, 2, 1]


def test_no_spec_counters_without_speculation():
    assert "spec_decode" not in PrometheusStatLogger("m").render()[0].decode()
