"""Tile the tensor-core skinny GEMM where it runs: inside a captured decode-like graph, with PDL.

``bench_gemm.py`` times each projection alone (L2 flushed, one launch), where a 20 us kernel's ramp and tail
and the launch dominate, and two runs of the same kernel can differ by half. In a
decode step the projections run back to back in a CUDA graph with programmatic dependent launch, so a tile
that fills and drains fast is worth more there. This script captures the projections of a whole step (32 x
qkv, o, gate_up, down on distinct weights, then the LM head: 15 GB, so L2 never serves them) at ``--rows``
rows, replays it, and tunes one shape's tile at a time with the others fixed (coordinate descent, ``--passes``
rounds). It reports the step's projection time for the table's tiles, the tuned tiles, cuBLAS and, at one
row, the GEMV, against weight bytes over the copy bandwidth measured in the same run.

Every candidate is compiled first by ``--compile-workers`` processes at once (Triton's on-disk cache then
serves the timing process).

Usage (CUDA machine, from the repository root, brigade-cuda installed)::

    PYTHONPATH=benchmarks/kernels python3 benchmarks/kernels/tune_skinny_graph.py --rows 8 --json out.json \\
        [--write-tiles builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import multiprocessing

import torch
import torch.nn.functional as F

from bench_attention import copy_bandwidth, graph_time_ms
from brigade_cuda.ops.gemm import GEMV_TILES, TILES, _tile, gemv, skinny_linear

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
          "down_proj": (4096, 14336), "lm_head": (128256, 4096)}
LAYER = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
NUM_LAYERS = 32
DTYPE = torch.bfloat16
GRID = [t for t in itertools.product([16, 32, 64], [64, 128, 256, 512], [4, 8], [2, 3, 4, 6])
        if t[0] * t[1] * 2 * t[3] <= 160 * 1024]  # weight stages in shared memory, with room for x


def _compile_one(task) -> str | None:
    """In a worker process: run one (shape, tile) once so that Triton compiles and caches the variant."""
    rows, n, k, tile = task
    x = torch.randn(rows, k, device="cuda", dtype=DTYPE)
    w = torch.randn(n, k, device="cuda", dtype=DTYPE)
    try:
        skinny_linear(x, w, tile=tile)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - out of resources: the timing pass skips the tile too
        return f"{type(e).__name__}"
    return None


class Step:
    """The projections of one decode step on distinct weights, replayed from a CUDA graph."""

    def __init__(self, rows: int):
        self.rows = rows
        self.weights = {name: [torch.randn(n, k, device="cuda", dtype=DTYPE) * 0.02
                               for _ in range(NUM_LAYERS if name != "lm_head" else 1)]
                        for name, (n, k) in SHAPES.items()}
        self.inputs = {name: torch.randn(rows, k, device="cuda", dtype=DTYPE) for name, (n, k) in SHAPES.items()}
        self.bytes = sum(w.numel() * w.element_size() for ws in self.weights.values() for w in ws)

    def run(self, gemm) -> None:
        for layer in range(NUM_LAYERS):
            for name in LAYER:
                gemm(name, self.inputs[name], self.weights[name][layer])
        gemm("lm_head", self.inputs["lm_head"], self.weights["lm_head"][0])

    def time_ms(self, gemm, replays: int = 12) -> float:
        """Median replay time of the captured step, in ms (run eagerly first: compiles and loads every
        variant outside the capture, and fails there if a tile cannot run)."""
        return graph_time_ms([lambda: self.run(gemm)], replays)


def skinny_with(tiles: dict):
    return lambda name, x, w: skinny_linear(x, w, tile=tiles[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="rows of x (the decode batch), 2 to 16")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--compile-workers", type=int, default=14)
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--write-tiles", help="write the tuned tiles into this table (the kernel's gemm_tiles.json)")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    tasks = [(args.rows, n, k, t) for n, k in SHAPES.values() for t in GRID]
    with concurrent.futures.ProcessPoolExecutor(args.compile_workers,
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        refused = sum(err is not None for err in pool.map(_compile_one, tasks, chunksize=4))
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s; compiled {len(tasks)} variants, {refused} refused", flush=True)

    step = Step(args.rows)
    bound_ms = step.bytes / copy_bw * 1e3
    record = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": copy_bw, "rows": args.rows,
              "weight_bytes": step.bytes, "bound_ms": bound_ms, "grid": GRID}
    record["cublas_ms"] = step.time_ms(lambda name, x, w: F.linear(x, w))
    table = {name: _tile(n, k) for name, (n, k) in SHAPES.items()}
    record["table_tiles"] = {name: list(t) for name, t in table.items()}
    record["table_ms"] = step.time_ms(skinny_with(table))
    ones = Step(1)
    record["gemv_m1_ms"] = ones.time_ms(lambda name, x, w: gemv(x, w))
    del ones
    print(f"bound {bound_ms:.3f} ms | cuBLAS {record['cublas_ms']:.3f} | skinny, table tiles "
          f"{record['table_ms']:.3f} | one-row GEMV {record['gemv_m1_ms']:.3f}", flush=True)

    best, best_ms = dict(table), record["table_ms"]
    record["trials"] = []
    for p in range(args.passes):
        for name in SHAPES:
            for tile in GRID:
                if tile == best[name]:
                    continue
                trial = {**best, name: tile}
                try:
                    ms = step.time_ms(skinny_with(trial))
                except Exception as e:  # noqa: BLE001 - a tile that cannot run is skipped
                    record["trials"].append({"shape": name, "tile": list(tile), "error": type(e).__name__})
                    continue
                record["trials"].append({"shape": name, "tile": list(tile), "ms": ms})
                if ms < best_ms * 0.995:  # keep a change only for a gain above the replay noise
                    best, best_ms = trial, ms
            print(f"pass {p} {name}: {best[name]} -> step {best_ms:.3f} ms", flush=True)
    record["tuned_tiles"] = {name: list(t) for name, t in best.items()}
    record["tuned_ms"] = step.time_ms(skinny_with(best))
    record["table_ms_again"] = step.time_ms(skinny_with(table))
    print(f"tuned {record['tuned_ms']:.3f} ms ({bound_ms / record['tuned_ms']:.0%} of copy) against the table's "
          f"{record['table_ms_again']:.3f} ms; tiles {record['tuned_tiles']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    if args.write_tiles:
        tiles = {**{k: list(v) for k, v in TILES.items()},
                 **{f"{n}x{k}": list(best[name]) for name, (n, k) in SHAPES.items()}}
        with open(args.write_tiles, "w") as f:
            json.dump({"device": record["device"], "measured_by": "benchmarks/kernels/tune_skinny_graph.py "
                       f"(tiles, in a captured step at {args.rows} rows) and bench_gemm.py (gemv_tiles)",
                       "tiles": tiles, "gemv_tiles": {k: list(v) for k, v in GEMV_TILES.items()}}, f, indent=2)


if __name__ == "__main__":
    main()
