"""Tile brigade-fp8's W8A16 decode kernels where they run: the FP8 projections of a decode step in a CUDA graph.

Like ``tune_skinny_graph.py`` for the bf16 kernels: the four projections of 32 Llama-3.1-8B layers on distinct
weights (7.0 GB of FP8, so L2 never serves them) at ``--rows`` rows are captured and replayed, and one shape's tile
is tuned at a time with the others fixed. At one row the kernel is the GEMV (the down projection in the form the
model runs it, SiLU-and-mul folded in: tile ``NxK/fp8_silu_mul``), at 2-16 rows the tensor-core skinny kernel.
It reports, per step: the FP8 weight bytes over the copy bandwidth (the bound), the same projections in bf16 on
brigade-cuda's kernels (bf16 weights, the tuned bf16 tiles), FP8 through ``torch._scaled_mm`` (per-token
quantization, then cuBLASLt: the path above 16 rows), the FP8 decode kernels with the bf16 tiles (what runs when
the table has no FP8 entries), and with the tuned tiles.

Usage (CUDA machine, from the repository root, brigade-cuda and brigade-fp8 installed)::

    PYTHONPATH=benchmarks/kernels python3 benchmarks/kernels/tune_fp8_decode_graph.py --rows 1 --json out.json \\
        [--write-tiles builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json]

``--write-tiles`` adds the tuned tiles to the table as ``"NxK/fp8"`` entries (``gemv_tiles`` at one row,
``tiles`` above) and keeps every other entry.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing

import torch

from bench_attention import copy_bandwidth, graph_time_ms
from brigade_cuda.ops.gemm import _gemv_tile, _tile, gemv, skinny_linear
from brigade_fp8.gemm import fp8_gemm_cuda
from brigade_fp8.quantize import quantize_fp8_per_channel

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
          "down_proj": (4096, 14336)}
NUM_LAYERS = 32
DTYPE = torch.bfloat16
GEMV_GRID = [(bn, bk, w, st) for bn, bk in [(4, 512), (4, 1024), (8, 512), (8, 1024), (16, 256), (16, 512),
                                            (16, 1024), (32, 256), (32, 512)] for w in (4, 8) for st in (1, 2, 3)]
SKINNY_GRID = [(bn, bk, w, st) for bn in (16, 32, 64) for bk in (128, 256, 512) for w in (4, 8) for st in (2, 3, 4, 6)
               if bn * bk * st + 16 * bk * 2 * st <= 160 * 1024]  # FP8 weight stages and bf16 x in shared memory


def _input(name: str, rows: int, k: int) -> torch.Tensor:
    # The down projection reads the gate/up output at one row (SiLU-and-mul folded into the GEMV).
    return torch.randn(rows, 2 * k if name == "down_proj" and rows == 1 else k, device="cuda", dtype=DTYPE)


def decode_call(name: str, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, tile) -> torch.Tensor:
    """One projection as the model runs it: GEMV at one row (SiLU folded for down), skinny GEMM above."""
    if x.shape[0] == 1:
        return gemv(x, w, silu_mul=name == "down_proj", weight_scale=s, tile=tile)
    return skinny_linear(x, w, weight_scale=s, tile=tile)


def _compile_one(task) -> str | None:
    """In a worker process: run one (shape, tile) once so that Triton compiles and caches the variant."""
    rows, name, tile = task
    n, k = SHAPES[name]
    w, s = quantize_fp8_per_channel(torch.randn(n, k, device="cuda"))
    try:
        decode_call(name, _input(name, rows, k), w, s, tile)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - out of resources: the timing pass skips the tile too
        return type(e).__name__
    return None


class Step:
    """The projections of one decode step on distinct FP8 (or bf16) weights, replayed from a CUDA graph."""

    def __init__(self, rows: int, fp8: bool):
        self.rows, self.weights = rows, {}
        for name, (n, k) in SHAPES.items():
            ws = [torch.randn(n, k, device="cuda", dtype=DTYPE) * 0.02 for _ in range(NUM_LAYERS)]
            self.weights[name] = [quantize_fp8_per_channel(w) for w in ws] if fp8 else [(w, None) for w in ws]
            del ws
        self.inputs = {name: _input(name, rows, k) for name, (n, k) in SHAPES.items()}
        self.bytes = sum(w.numel() * w.element_size() for ws in self.weights.values() for w, _ in ws)

    def time_ms(self, call, replays: int = 12) -> float:
        """Median replay time of the captured step in ms; ``call(name, x, w, s)`` runs one projection."""
        def run():
            for layer in range(NUM_LAYERS):
                for name in SHAPES:
                    call(name, self.inputs[name], *self.weights[name][layer])
        return graph_time_ms([run], replays)


def table_tile(name: str, rows: int, fp8: bool):
    n, k = SHAPES[name]
    if rows == 1:
        return _gemv_tile(n, k, "silu_mul" if name == "down_proj" else "", fp8=fp8)
    return _tile(n, k, fp8=fp8)


def tune(step: Step, grid: list, start: dict, passes: int, record: dict) -> tuple[dict, float]:
    """Coordinate descent over one shape's tile at a time; a change is kept for a gain above the replay noise."""
    best = dict(start)
    best_ms = step.time_ms(lambda name, x, w, s: decode_call(name, x, w, s, best[name]))
    for p in range(passes):
        for name in SHAPES:
            for tile in grid:
                if tile == best[name]:
                    continue
                trial = {**best, name: tile}
                try:
                    ms = step.time_ms(lambda nm, x, w, s: decode_call(nm, x, w, s, trial[nm]))
                except Exception as e:  # noqa: BLE001 - a tile that cannot run is skipped
                    record["trials"].append({"shape": name, "tile": list(tile), "error": type(e).__name__})
                    continue
                record["trials"].append({"shape": name, "tile": list(tile), "ms": ms})
                if ms < best_ms * 0.995:
                    best, best_ms = trial, ms
            print(f"pass {p} {name}: {best[name]} -> step {best_ms:.3f} ms", flush=True)
    return best, best_ms


def write_tiles(path: str, rows: int, best: dict) -> None:
    """Add ``"NxK/fp8"`` entries (and ``"NxK/fp8_silu_mul"`` for the down projection at one row) to the table at
    ``path`` (``gemv_tiles`` at one row, ``tiles`` above), keeping its other entries."""
    with open(path) as f:
        table = json.load(f)
    section = table.setdefault("gemv_tiles" if rows == 1 else "tiles", {})
    for name, (n, k) in SHAPES.items():
        section[f"{n}x{k}/fp8"] = list(best[name])
        if rows == 1 and name == "down_proj":
            section[f"{n}x{k}/fp8_silu_mul"] = list(best[name])
    with open(path, "w") as f:
        json.dump(table, f, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1, help="rows of x (the decode batch), 1 to 16")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--compile-workers", type=int, default=14)
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--write-tiles", help="add the tuned tiles to this table (the kernel's gemm_tiles.json)")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    grid = GEMV_GRID if args.rows == 1 else SKINNY_GRID
    tasks = [(args.rows, name, t) for name in SHAPES for t in grid]
    with concurrent.futures.ProcessPoolExecutor(args.compile_workers,
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        refused = sum(err is not None for err in pool.map(_compile_one, tasks, chunksize=4))
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s; compiled {len(tasks)} variants, {refused} refused", flush=True)

    record = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": copy_bw, "rows": args.rows,
              "grid": grid, "trials": []}
    bf16 = Step(args.rows, fp8=False)
    record["bf16_ms"] = bf16.time_ms(lambda name, x, w, s: decode_call(name, x, w, None, table_tile(name, args.rows,
                                                                                                    False)))
    del bf16
    step = Step(args.rows, fp8=True)
    record["fp8_weight_bytes"] = step.bytes
    record["bound_ms"] = step.bytes / copy_bw * 1e3

    def scaled_mm(name, x, w, s):
        if x.shape[1] != w.shape[1]:  # the down projection's gate/up input: the activation first, as the model does
            x = torch.nn.functional.silu(x[:, :w.shape[1]]) * x[:, w.shape[1]:]
        return fp8_gemm_cuda(x, w, s, None, None)

    record["scaled_mm_ms"] = step.time_ms(scaled_mm)
    start = {name: table_tile(name, args.rows, True) for name in SHAPES}
    record["table_tiles"] = {name: list(t) for name, t in start.items()}
    record["table_ms"] = step.time_ms(lambda name, x, w, s: decode_call(name, x, w, s, start[name]))
    print(f"rows {args.rows}: bound {record['bound_ms']:.3f} ms | bf16 kernels {record['bf16_ms']:.3f} | FP8 "
          f"_scaled_mm {record['scaled_mm_ms']:.3f} | FP8 decode kernels, table tiles {record['table_ms']:.3f}",
          flush=True)
    best, best_ms = tune(step, grid, start, args.passes, record)
    record["tuned_tiles"] = {name: list(t) for name, t in best.items()}
    record["tuned_ms"] = best_ms
    print(f"tuned {best_ms:.3f} ms ({record['bound_ms'] / best_ms:.0%} of copy) against {record['table_ms']:.3f} "
          f"with the table's tiles; tiles {record['tuned_tiles']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    if args.write_tiles:
        write_tiles(args.write_tiles, args.rows, best)


if __name__ == "__main__":
    main()
