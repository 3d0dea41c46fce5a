"""Benchmark records: statistics, JSON-safe values, and the file each run writes."""

from __future__ import annotations

import json
import math
import os

import pytest

from brigade.benchmarks.results import (build_record, default_results_dir, jsonable, percentile, ratio, summarize,
                                        write_record)
from brigade.benchmarks.serve import arrival_delays


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 99) == pytest.approx(3.97)


def test_summarize_scales_and_marks_missing_metrics():
    stats = summarize([0.001, 0.003, 0.002], scale=1000.0)
    assert stats["mean"] == pytest.approx(2.0) and stats["median"] == pytest.approx(2.0)
    assert stats["count"] == 3 and stats["min"] == pytest.approx(1.0) and stats["max"] == pytest.approx(3.0)
    empty = summarize([])
    assert empty["count"] == 0 and math.isnan(empty["mean"])


def test_records_are_strict_json(tmp_path):
    record = build_record("throughput", device={"device_type": "cpu"}, benchmark_config={"rate": float("inf")},
                          engine_config={"x": 1}, results={"brigade": summarize([])},
                          ratios={"a/b": ratio(1.0, 0.0)})
    path = write_record(record, str(tmp_path / "sub" / "r.json"))
    text = open(path, encoding="utf-8").read()
    assert "NaN" not in text and "Infinity" not in text
    loaded = json.loads(text)
    assert loaded["kind"] == "throughput" and loaded["results"]["brigade"]["mean"] is None
    assert loaded["ratios"]["a/b"] is None and loaded["command"] and loaded["argv"]
    assert jsonable((1, {"k": float("nan")})) == [1, {"k": None}]


def test_records_go_under_the_cache_directory_unless_a_path_is_given(tmp_path, monkeypatch):
    """Without --output-json a record lands in $BRIGADE_CACHE_DIR/bench (~/.cache/brigade/bench when unset),
    never in the working directory (a source checkout, often)."""
    workdir, cache = tmp_path / "checkout", tmp_path / "cache"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("BRIGADE_CACHE_DIR", str(cache))
    record = build_record("serve", device={}, benchmark_config={}, engine_config={}, results={})
    path = write_record(record, None)
    assert os.path.dirname(path) == str(cache / "bench") and path.endswith("-serve.json")
    assert json.loads(open(path, encoding="utf-8").read())["kind"] == "serve"
    assert list(workdir.iterdir()) == []
    monkeypatch.delenv("BRIGADE_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_results_dir() == str(tmp_path / "home" / ".cache" / "brigade" / "bench")


def test_poisson_arrivals_have_the_requested_mean_rate():
    delays = arrival_delays(4000, 8.0, seed=0)
    assert sum(delays) / len(delays) == pytest.approx(1 / 8.0, rel=0.06)
    assert arrival_delays(3, float("inf"), seed=0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_delays(3, 0.0, seed=0)
