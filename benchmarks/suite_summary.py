"""Summarise one result folder of the GPU headline suite (``benchmarks/run_gpu_suite.sh``) as a table.

Reads the JSON records the suite writes (any subset of them; missing ones are skipped):

=========================  ======================================================================
``limits.json``            ``benchmarks/device_limits.py``: copy bandwidth, batch-1 TPOT bound, matmul peak
                           (``roofline.json`` of ``python -m brigade.benchmarks.roofline`` is read instead
                           when there is no ``limits.json``)
``latency.json``           bench 1, ``brigade bench latency`` at batch 1 (with the HF ``generate`` peer)
``throughput_1024_128``    bench 2, ``brigade bench throughput``, 1000 x (1024 in, 128 out)
``throughput_sharegpt``    bench 3, ``brigade bench throughput --dataset sharegpt-like``, 1000 prompts
``throughput_sharegpt_penalty``  bench 3 with ``--repetition-penalty-fraction 0.1`` (overlap kept on)
``peers_1024_128``         bench 4, ``--hf-peer both`` on 64 x (1024 in, 128 out)
``peers_sharegpt``         bench 4, ``--hf-peer both`` on bench 3's first 64 prompts
``serve_rate_R``           bench 5, ``brigade bench serve`` at R requests/s (``serve.log``: the server's log)
``fp8_*``                  FP8 benches 1-4 (``--quantization fp8``): ``fp8_latency``, ``fp8_throughput_1024_128``,
                           ``fp8_throughput_sharegpt`` (and ``--kv-cache-dtype fp8``), ``fp8_latency_b64`` with
                           ``latency_b64`` (bf16) beside it
``moe_*``, ``fused_moe``   MoE benches 1-5: ``moe_latency_<model>``, ``moe_throughput_1024_128`` (Mixtral),
                           ``moe_throughput_sharegpt`` (Qwen3-30B-A3B), ``fused_moe`` (``bench_fused_moe.py``)
``shape_*``                attention-shape benches s1-s4: ``shape_latency_gemma-2-9b``,
                           ``shape_latency_gpt-oss-20b``, ``shape_kv_capacity`` (``kv_capacity.py``, Gemma-3-12B
                           against its all-full twin), ``shape_long_prompt_mistral-7b`` and ``shape_kv_mistral-7b``
=========================  ======================================================================

The FP8, MoE and shape bounds come from the model's ``config.json`` (``model_shapes.py``: the parameters one token
reads, projections at one byte under FP8; the shape latencies add the KV cache a decode step reads at the run's
mean context) and the copy bandwidth and matmul peak in ``limits.json``.

and writes ``summary.json`` (a list of rows: ``bench``, ``name``, ``figure``, ``unit``, ``bound``, ``ratio``,
``peer``, ``target``, ``met``, ``source``) and ``summary.md`` (the same as a markdown table) into the folder,
then prints the table. ``--baseline DIR`` adds the change of each headline figure against another result folder
(positive = better). Needs no GPU: run it on the development machine after copying the folder back.

Usage::

    python benchmarks/suite_summary.py benchmarks/results/h200/2026-12-01T1200Z [--baseline OTHER_DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model_shapes beside this file
from model_shapes import kv_bytes_per_token, kv_bytes_read, load_config, token_params  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "configs"

# Targets of the headline suite: (kind, value). "max_ratio": figure / bound at most; "min_ratio": the ratio
# (figure over the better peer) at least; "min": figure at least; "max": figure at most.
TARGETS = {
    "bench1": ("max_ratio", 1.15),
    "bench2": ("min", 30_000.0),
    "bench3": ("min", 40.0),
    "bench4": ("min_ratio", 20.0),
    "bench5_16": ("max", 12.0),
    "bench3p": ("min_ratio_of_bench3", 0.95),
    "fp8_1": ("max_ratio", 1.15),
    "fp8_1_bf16": ("max_ratio_of", 0.6, "bench 1 (bf16)"),
    "fp8_2": ("min_ratio_of", 1.6, "bench 2 (bf16)"),
    "fp8_3": ("min_ratio_of", 1.3, "bench 3 (bf16)"),
    "fp8_4": ("max_ratio", 1.3),
    "moe_1": ("max_ratio", 1.25),
    "moe_2": ("max_ratio", 1.4),
    "moe_3": ("min_ratio_of", 0.5, "the compute bound"),
    "moe_5": ("min_ratio_of", 1.0, "the faster of the reference and the dense loop, at every size"),
    "shape_1": ("max_ratio", 1.15),
    "shape_2": ("max_ratio", 1.4),
}


def _load(folder: Path, stem: str) -> dict | None:
    path = folder / f"{stem}.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def _prompts(record: dict) -> int | str:
    return record.get("config", {}).get("benchmark", {}).get("num_prompts", "?")


def _brigade(record: dict) -> dict:
    return record.get("results", {}).get("brigade", {})


def _row(bench: str, name: str, figure: float | None, unit: str, source: str, *, bound: float | None = None,
         ratio: float | None = None, peer: str = "", higher_is_better: bool = True) -> dict:
    target = TARGETS.get(bench)
    met = None
    target_text = ""
    if target is not None and figure is not None:
        kind, value, *what = target
        if kind == "min_ratio_of":
            met = ratio is not None and ratio >= value
            target_text = f">= {value:g}x {what[0]}"
        elif kind == "max_ratio_of":
            met = ratio is not None and ratio <= value
            target_text = f"<= {value:g}x {what[0]}"
        elif kind == "max_ratio":
            met = ratio is not None and ratio <= value
            target_text = f"<= {value:g}x bound"
        elif kind == "min_ratio":
            met = ratio is not None and ratio >= value
            target_text = f">= {value:g}x the better peer"
        elif kind == "min_ratio_of_bench3":
            met = ratio is not None and ratio >= value
            target_text = f">= {value:g}x bench 3"
        elif kind == "min":
            met = figure >= value
            target_text = f">= {value:,g}"
        else:
            met = figure <= value
            target_text = f"<= {value:g} {unit}"
    return {"bench": bench, "name": name, "figure": figure, "unit": unit, "bound": bound, "ratio": ratio,
            "peer": peer, "target": target_text, "met": met, "source": source,
            "higher_is_better": higher_is_better}


def limits_rows(folder: Path) -> tuple[list[dict], dict]:
    limits = _load(folder, "limits") or _load(folder, "roofline")
    if limits is None:
        return [], {}
    source = "limits.json" if (folder / "limits.json").exists() else "roofline.json"
    rows = [_row("limits", "copy bandwidth", limits.get("copy_bandwidth_GBps"), "GB/s", source),
            _row("limits", "batch-1 TPOT bound", limits.get("bound_tpot_ms"), "ms", source, higher_is_better=False)]
    if limits.get("matmul_tflops") is not None:
        rows.append(_row("limits", "dense matmul peak", limits["matmul_tflops"], "TFLOP/s", source))
    return rows, limits


def latency_row(folder: Path, limits: dict) -> list[dict]:
    record = _load(folder, "latency")
    if record is None:
        return []
    tpot = _brigade(record).get("tpot_ms", {}).get("median")
    bound = limits.get("bound_tpot_ms")
    hf = record.get("results", {}).get("hf_generate", {}).get("tpot_ms", {}).get("median")
    peer = f"HF generate {hf:.2f} ms ({hf / tpot:.1f}x slower)" if hf and tpot else ""
    ratio = tpot / bound if tpot and bound else None
    return [_row("bench1", "latency, batch 1, 128 in / 256 out: TPOT median", tpot, "ms", "latency.json",
                 bound=bound, ratio=ratio, peer=peer, higher_is_better=False)]


def throughput_rows(folder: Path, limits: dict) -> list[dict]:
    rows = []
    bound = limits.get("bound_total_tokens_per_s")
    record = _load(folder, "throughput_1024_128")
    if record is not None:
        b = _brigade(record)
        total = b.get("total_tokens_per_s")
        detail = f"{b.get('requests_per_s', 0):.1f} req/s, {b.get('output_tokens_per_s', 0):,.0f} output tok/s"
        rows.append(_row("bench2", f"throughput, {_prompts(record)} x (1024 in, 128 out): total tok/s", total,
                         "tok/s", "throughput_1024_128.json", bound=bound,
                         ratio=total / bound if total and bound else None, peer=detail))
    record = _load(folder, "throughput_sharegpt")
    if record is not None:
        b = _brigade(record)
        rows.append(_row("bench3", f"throughput, {_prompts(record)} ShareGPT-like prompts: req/s",
                         b.get("requests_per_s"), "req/s", "throughput_sharegpt.json",
                         peer=f"{b.get('output_tokens_per_s', 0):,.0f} output tok/s, "
                              f"{b.get('total_tokens_per_s', 0):,.0f} total tok/s"))
        plain = b.get("requests_per_s")
        penalized = _load(folder, "throughput_sharegpt_penalty")
        if penalized is not None and plain:
            got = _brigade(penalized).get("requests_per_s")
            rows.append(_row("bench3p", "bench 3 with 10% of requests at repetition_penalty 1.1: req/s", got,
                             "req/s", "throughput_sharegpt_penalty.json",
                             ratio=got / plain if got else None, peer=f"bench 3 in the same run: {plain:.1f} req/s"))
    return rows


def peer_rows(folder: Path) -> list[dict]:
    rows = []
    for stem, label in (("peers_1024_128", "1024 in, 128 out"), ("peers_sharegpt", "ShareGPT-like")):
        record = _load(folder, stem)
        if record is None:
            continue
        results = record.get("results", {})
        ours = _brigade(record).get("output_tokens_per_s")
        peers = {name: results[name]["output_tokens_per_s"] for name in ("hf_generate", "hf_generate_batch")
                 if "output_tokens_per_s" in results.get(name, {})}
        best = max(peers.values()) if peers else None
        ratio = ours / best if ours and best else None
        text = ", ".join(f"{name[3:]} {value:,.0f} tok/s" for name, value in peers.items())
        rows.append(_row("bench4", f"vs HF peers, {_prompts(record)} prompts, {label}: output tok/s", ours, "tok/s",
                         f"{stem}.json", ratio=ratio, peer=text))
    return rows


def _rate_key(path: Path) -> float:
    rate = path.stem.removeprefix("serve_rate_")
    return math.inf if rate == "inf" else float(rate)


def serve_rows(folder: Path) -> list[dict]:
    rows = []
    log = folder / "serve.log"
    compiles = log.read_text(errors="replace").count("compiling a new variant") if log.exists() else None
    for path in sorted(folder.glob("serve_rate_*.json"), key=_rate_key):
        record = _load(folder, path.stem)
        if record is None:
            continue
        b = _brigade(record)
        rate = path.stem.removeprefix("serve_rate_")
        tpot = b.get("tpot_ms", {}).get("median")
        notes = [f"TTFT median {b.get('ttft_ms', {}).get('median', float('nan')):.1f} ms",
                 f"ITL p99 {b.get('itl_ms', {}).get('p99', float('nan')):.1f} ms",
                 f"{b.get('completed', '?')}/{b.get('num_requests', '?')} completed"]
        if compiles is not None:
            notes.append(f"{compiles} compiles while serving")
        bench = "bench5_16" if rate == "16" else "bench5"
        rows.append(_row(bench, f"serve at {rate} req/s: TPOT median", tpot, "ms", path.name, peer="; ".join(notes),
                         higher_is_better=False))
    return rows


def _config_of(record: dict) -> dict | None:
    """The ``config.json`` of the model a record ran (one of ``benchmarks/configs``, by the folder's name)."""
    model = record.get("config", {}).get("engine", {}).get("model_config", {}).get("model")
    path = CONFIGS / Path(str(model)).name
    return load_config(path) if model and (path / "config.json").exists() else None


def _tpot(record: dict | None) -> float | None:
    return None if record is None else _brigade(record).get("tpot_ms", {}).get("median")


def fp8_rows(folder: Path, limits: dict) -> list[dict]:
    """FP8 benches 1-4 (docs/quantization.md): bounds at one byte per projection weight, bf16 figures beside."""
    rows, bandwidth = [], (limits.get("copy_bandwidth_GBps") or 0) * 1e9
    bf16_tpot, fp8 = _tpot(_load(folder, "latency")), _load(folder, "fp8_latency")
    config = _config_of(fp8) if fp8 else None
    tpot = _tpot(fp8)
    if tpot and config:
        bound = token_params(config).weight_bytes(1.0) / bandwidth * 1e3 if bandwidth else None
        peer = f"bf16 bench 1: {bf16_tpot:.2f} ms" if bf16_tpot else ""
        rows.append(_row("fp8_1", "FP8 latency, batch 1, 128 in / 256 out: TPOT median", tpot, "ms",
                         "fp8_latency.json", bound=bound, ratio=tpot / bound if bound else None, peer=peer,
                         higher_is_better=False))
        if bf16_tpot:
            rows.append(_row("fp8_1_bf16", "FP8 latency against bf16: TPOT", tpot, "ms", "fp8_latency.json",
                             ratio=tpot / bf16_tpot, peer=peer, higher_is_better=False))
    for bench, stem, plain_stem, key, unit in (
            ("fp8_2", "fp8_throughput_1024_128", "throughput_1024_128", "total_tokens_per_s", "tok/s"),
            ("fp8_3", "fp8_throughput_sharegpt", "throughput_sharegpt", "requests_per_s", "req/s")):
        record, plain = _load(folder, stem), _load(folder, plain_stem)
        if record is None:
            continue
        got, base = _brigade(record).get(key), _brigade(plain).get(key) if plain else None
        what = "1000 x (1024 in, 128 out): total tok/s" if bench == "fp8_2" else \
            "ShareGPT-like prompts, fp8 KV cache: req/s"
        rows.append(_row(bench, f"FP8 throughput, {what}", got, unit, f"{stem}.json",
                         ratio=got / base if got and base else None,
                         peer=f"bf16 in the same run: {base:,.{0 if unit == 'tok/s' else 1}f} {unit}" if base else ""))
    record, plain = _load(folder, "fp8_latency_b64"), _load(folder, "latency_b64")
    tpot, config = _tpot(record), _config_of(record) if record else None
    if tpot and config:
        bench = record["config"]["benchmark"]
        batch, context = bench.get("batch_size", 64), bench.get("input_len", 128) + bench.get("output_len", 256) / 2
        read = token_params(config).weight_bytes(1.0) + batch * context * kv_bytes_per_token(config)
        bound = read / bandwidth * 1e3 if bandwidth else None
        rows.append(_row("fp8_4", f"FP8 latency, batch {batch}: TPOT median", tpot, "ms", "fp8_latency_b64.json",
                         bound=bound, ratio=tpot / bound if bound else None, higher_is_better=False,
                         peer=f"bf16 batch {batch}: {_tpot(plain):.2f} ms" if _tpot(plain) else ""))
    return rows


def moe_rows(folder: Path, limits: dict) -> list[dict]:
    """MoE benches 1-5 (docs/moe.md): bounds on the active parameters (attention, router, top-k experts, LM head)."""
    rows, bandwidth = [], (limits.get("copy_bandwidth_GBps") or 0) * 1e9
    for bench, model in (("moe_1", "mixtral-8x7b"), ("moe_2", "qwen3-30b-a3b")):
        record = _load(folder, f"moe_latency_{model}")
        tpot, config = _tpot(record), _config_of(record) if record else None
        if tpot and config:
            bound = token_params(config).weight_bytes() / bandwidth * 1e3 if bandwidth else None
            rows.append(_row(bench, f"MoE latency, {model}, batch 1: TPOT median", tpot, "ms",
                             f"moe_latency_{model}.json", bound=bound, ratio=tpot / bound if bound else None,
                             higher_is_better=False))
    record = _load(folder, "moe_throughput_1024_128")
    config = _config_of(record) if record else None
    if record and config:
        total, peak = _brigade(record).get("total_tokens_per_s"), limits.get("matmul_tflops")
        bound = peak * 1e12 / (2 * token_params(config).total) if peak else None
        rows.append(_row("moe_3", "MoE throughput, mixtral-8x7b, 1000 x (1024 in, 128 out): total tok/s", total,
                         "tok/s", "moe_throughput_1024_128.json", bound=bound,
                         ratio=total / bound if total and bound else None))
    record, dense = _load(folder, "moe_throughput_sharegpt"), _load(folder, "throughput_sharegpt")
    if record:
        got, base = _brigade(record).get("requests_per_s"), _brigade(dense).get("requests_per_s") if dense else None
        rows.append(_row("moe_4", "MoE throughput, qwen3-30b-a3b, ShareGPT-like prompts: req/s", got, "req/s",
                         "moe_throughput_sharegpt.json",
                         peer=f"dense 8B bench 3 in the same run: {base:.1f} req/s" if base else ""))
    kernel = _load(folder, "fused_moe")
    if kernel and kernel.get("rows"):
        worst = min(kernel["rows"], key=lambda r: min(r["speedup_vs_reference"], r["speedup_vs_dense_loop"]))
        ratio = min(worst["speedup_vs_reference"], worst["speedup_vs_dense_loop"])
        rows.append(_row("moe_5", "fused MoE kernel: speed-up over the faster alternative, worst size", ratio, "x",
                         "fused_moe.json", ratio=ratio,
                         peer=f"worst at {worst['shape']}, {worst['tokens']} tokens"))
    return rows


def _shape_latency_row(bench: str, model: str, record: dict | None, bandwidth: float) -> list[dict]:
    """A batch-1 decode TPOT against the weights one token reads plus the KV cache it reads at the mean context
    (prompt + half the output; sliding-window layers read at most their window)."""
    tpot, config = _tpot(record), _config_of(record) if record else None
    if not (tpot and config):
        return []
    bench_config = record["config"]["benchmark"]
    batch = bench_config.get("batch_size", 1)
    context = bench_config.get("input_len", 128) + bench_config.get("output_len", 256) / 2
    weights, kv = token_params(config).weight_bytes(), batch * kv_bytes_read(config, context)
    bound = (weights + kv) / bandwidth * 1e3 if bandwidth else None
    return [_row(bench, f"{model} shape, batch {batch}, {bench_config.get('input_len')} in / "
                        f"{bench_config.get('output_len')} out: TPOT median", tpot, "ms",
                 f"shape_latency_{model}.json", bound=bound, ratio=tpot / bound if bound else None,
                 peer=f"bound reads {weights / 1e9:.2f} GB of weights + {kv / 1e6:.0f} MB of KV cache "
                      f"({kv / (weights + kv):.1%})", higher_is_better=False)]


def _capacity_row(record: dict) -> list[dict]:
    """s3: sequences that fit, the hybrid model over its all-full twin (``kv_capacity.py --against``)."""
    if record.get("ratio") is None or len(record.get("models", ())) != 2:
        return []
    hybrid, full = record["models"]
    kinds = ", ".join(f"{g['kind']} {len(g['layers'])}" for g in hybrid["groups"])
    peer = (f"{hybrid['fit']} against {full['fit']} (budget {hybrid['max_num_batched_tokens']} tokens a step); "
            f"{hybrid['num_blocks']:,} blocks in groups {kinds} against {full['num_blocks']:,}; while decoding "
            f"{record['ratio_decoding']:.2f}x")
    if hybrid.get("groups_source") == "engine without KV cache groups":
        peer += "; the engine had no KV cache groups"
    name = f"{Path(hybrid['model']).name} shape: {record['seq_len']}-token sequences that fit, over every layer full"
    return [_row("shape_3", name, record["ratio"], "x", "shape_kv_capacity.json", ratio=record["ratio"], peer=peer)]


def _windowed_bytes_row(record: dict) -> list[dict]:
    """s4: KV bytes one sequence's sliding-window layers hold at their peak (``kv_capacity.py`` on the model)."""
    model = record["models"][0]
    windowed = [g for g in model["groups"] if g["sliding_window"]]
    if not windowed:
        return []
    peak, decoding, full = (sum(g[key] for g in windowed) for key in ("bytes_peak", "bytes_decoding", "bytes_if_full"))
    layers = sum(len(g["layers"]) for g in windowed)
    name = (f"{Path(model['model']).name}: KV bytes the {layers} windowed layers hold, one "
            f"{record['seq_len']}-token sequence")
    return [_row("shape_4_kv", name, peak / 1e9, "GB", "shape_kv_mistral-7b.json",
                 ratio=peak / full, higher_is_better=False,
                 peer=f"while decoding {decoding / 1e9:.2f} GB; every block kept {full / 1e9:.2f} GB")]


def shape_rows(folder: Path, limits: dict) -> list[dict]:
    """Attention-shape benches s1-s4 (docs/benchmarks.md): Gemma 2, gpt-oss, Gemma 3's KV capacity, Mistral's
    long prompt."""
    bandwidth = (limits.get("copy_bandwidth_GBps") or 0) * 1e9
    rows = []
    for bench, model in (("shape_1", "gemma-2-9b"), ("shape_2", "gpt-oss-20b")):
        rows += _shape_latency_row(bench, model, _load(folder, f"shape_latency_{model}"), bandwidth)
    capacity = _load(folder, "shape_kv_capacity")
    rows += _capacity_row(capacity) if capacity else []
    record = _load(folder, "shape_long_prompt_mistral-7b")
    if record is not None:
        b, bench_config = _brigade(record), record["config"]["benchmark"]
        what = f"mistral-7b shape, {bench_config.get('input_len')}-token prompt, {bench_config.get('output_len')} out"
        rows.append(_row("shape_4", f"{what}: TTFT median", b.get("ttft_ms", {}).get("median"), "ms",
                         "shape_long_prompt_mistral-7b.json", higher_is_better=False))
        rows.append(_row("shape_4", f"{what}: TPOT median", _tpot(record), "ms", "shape_long_prompt_mistral-7b.json",
                         higher_is_better=False))
    kv = _load(folder, "shape_kv_mistral-7b")
    return rows + (_windowed_bytes_row(kv) if kv and kv.get("models") else [])


def summarize(folder: Path) -> list[dict]:
    rows, limits = limits_rows(folder)
    return (rows + latency_row(folder, limits) + throughput_rows(folder, limits) + peer_rows(folder)
            + serve_rows(folder) + fp8_rows(folder, limits) + moe_rows(folder, limits) + shape_rows(folder, limits))


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{text} {unit}".strip()


def add_baseline(rows: list[dict], baseline: list[dict]) -> None:
    """Set each row's ``change_pct`` against the row of the same name in ``baseline`` (positive = better)."""
    before = {row["name"]: row for row in baseline}
    for row in rows:
        old = before.get(row["name"])
        if row["bench"] == "limits" or old is None or not row["figure"] or not old["figure"]:
            continue
        change = (row["figure"] / old["figure"] - 1) * 100
        row["change_pct"] = change if row["higher_is_better"] else -change


def markdown(rows: list[dict]) -> str:
    with_baseline = any("change_pct" in row for row in rows)
    head = ["benchmark", "figure", "bound", "ratio", "peer / detail", "target", "met"]
    if with_baseline:
        head.append("vs baseline")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ratio = "–" if row["ratio"] is None else f"{row['ratio']:.3f}x" if row["ratio"] < 10 else f"{row['ratio']:.1f}x"
        met = "" if row["met"] is None else ("yes" if row["met"] else "**no**")
        cells = [row["name"], _fmt(row["figure"], row["unit"]), _fmt(row["bound"], row["unit"]), ratio,
                 row["peer"], row["target"], met]
        if with_baseline:
            cells.append("–" if "change_pct" not in row else f"{row['change_pct']:+.1f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/suite_summary.py", description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="one result folder of run_gpu_suite.sh")
    parser.add_argument("--baseline", type=Path, default=None, help="another result folder to compare against")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"no such folder: {args.folder}", file=sys.stderr)
        return 2
    rows = summarize(args.folder)
    if args.baseline is not None:
        add_baseline(rows, summarize(args.baseline))
    (args.folder / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = markdown(rows)
    (args.folder / "summary.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
