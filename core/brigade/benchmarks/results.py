"""Benchmark records: summary statistics, the machine's description, and the JSON file each run writes.

Every run writes one JSON object (schema below) to ``--output-json``, or else to
``$BRIGADE_CACHE_DIR/bench/<UTC timestamp>-<kind>.json`` (default ``~/.cache/brigade/bench/``; never into the
working directory unasked), so a number in docs/benchmarks.md can always be traced to its command, machine and
configuration::

    {"kind": "throughput" | "latency" | "serve", "timestamp": ISO-8601 UTC, "command": str, "argv": [str],
     "device": {...device_info()}, "config": {"benchmark": {...}, "engine": {...}},
     "results": {"brigade": {...}, "<peer>": {...}}, "ratios": {"brigade/<peer>/<metric>": float}}
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import platform as py_platform
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import torch



def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linearly interpolated (numpy's default).

    Raises:
        ValueError: on an empty sequence.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = (len(sorted_values) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def summarize(values: Sequence[float], *, scale: float = 1.0) -> dict[str, float | int]:
    """{"mean", "median", "p99", "min", "max", "count"} of ``values`` times ``scale`` (e.g. 1000 for s -> ms).

    An empty input gives count 0 and NaN statistics, so a missing metric is visible, never zero.
    """
    if not values:
        nan = float("nan")
        return {"mean": nan, "median": nan, "p99": nan, "min": nan, "max": nan, "count": 0}
    ordered = sorted(v * scale for v in values)
    return {"mean": sum(ordered) / len(ordered), "median": percentile(ordered, 50), "p99": percentile(ordered, 99),
            "min": ordered[0], "max": ordered[-1], "count": len(ordered)}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall back to what the platform module knows
    return py_platform.processor() or py_platform.machine()


def _accelerator_name(device_type: str) -> str | None:
    """torch's name for device 0 of this type (cuda, xpu, ...), or None for the CPU."""
    if device_type == "cpu":
        return None
    module = getattr(torch, device_type, None)
    get_name = getattr(module, "get_device_name", None)
    if get_name is None:
        return None
    return get_name(0)


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages now (None where the OS has none). Sampled right after a timed
    phase, the 1-minute figure tells whether other work shared the machine (our own run counts ~1 per busy
    thread)."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def device_info(device_type: str, platform_name: str) -> dict[str, Any]:
    """What the numbers were measured on: accelerator, CPU model, threads, load and library versions."""
    import transformers

    from brigade.version import __version__

    return {
        "platform": platform_name,
        "device_type": device_type,
        "device_name": _accelerator_name(device_type) or _cpu_model(),
        "cpu_model": _cpu_model(),
        "num_cpus": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "load_average_1_5_15": load_average(),
        "python": py_platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "brigade": __version__,
    }


def command_line(argv: Sequence[str] | None = None) -> tuple[str, list[str]]:
    """(the shell-quoted command, its argv) of this process, with the program shown as ``brigade``."""
    argv = list(sys.argv if argv is None else argv)
    shown = ["brigade", *argv[1:]] if argv and os.path.basename(argv[0]) in ("brigade", "main.py", "__main__.py") \
        else argv
    return shlex.join(shown), shown


def jsonable(value: Any) -> Any:
    """Dataclasses, dicts, lists and scalars to plain JSON values (NaN and inf become null; others str)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN; null marks a metric that could not be measured
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def default_results_dir() -> str:
    """Where a run writes its record without ``--output-json``: ``$BRIGADE_CACHE_DIR/bench``, by default
    ``~/.cache/brigade/bench`` (read when called)."""
    from brigade.cache_paths import cache_dir

    return str(cache_dir() / "bench")


def default_output_path(kind: str, results_dir: str | None = None) -> str:
    """``<results_dir>/<UTC timestamp>-<kind>.json`` (default: ``default_results_dir()``)."""
    results_dir = default_results_dir() if results_dir is None else results_dir
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return os.path.join(results_dir, f"{stamp}-{kind}.json")


def build_record(kind: str, *, device: dict[str, Any], benchmark_config: dict[str, Any],
                 engine_config: Any, results: dict[str, dict[str, Any]],
                 ratios: dict[str, float] | None = None) -> dict[str, Any]:
    """The JSON object of one run (schema in the module docstring)."""
    command, argv = command_line()
    return {"kind": kind, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "argv": argv, "device": device,
            "config": {"benchmark": jsonable(benchmark_config), "engine": jsonable(engine_config)},
            "results": jsonable(results), "ratios": jsonable(ratios or {})}


def write_record(record: dict[str, Any], path: str | None) -> str:
    """Write ``record`` as indented JSON to ``path`` (default: a new file under ``default_results_dir()``).

    Returns the path written. Raises OSError when the file cannot be written.
    """
    path = path or default_output_path(record["kind"])
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=False)
        f.write("\n")
    return path


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return numerator / denominator
