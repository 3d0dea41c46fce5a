"""brigade-fp8's Triton W8A8 GEMM (``triton_gemm.w8a8_gemm``) against ``torch._scaled_mm`` at decode batches.

For each ``--rows`` count and each projection of 32 Llama-3.1-8B layers (distinct FP8 weights, 7.0 GB, so L2
never serves them; per-token quantized activations prepared beforehand), the 32 products are captured in a CUDA
graph and replayed: ``_scaled_mm`` (what ``fp8_gemm_cuda`` runs) and the Triton kernel with every tile of
``GRID`` (compiled first in parallel processes), keeping the fastest correct one per shape (relative error against
``_scaled_mm`` below 1e-2). Prints per rows the step's four projections: ``_scaled_mm``, the Triton kernel with its
default tile, with the best tiles, and the FP8 bound (weight bytes over the copy bandwidth of the same run).

Usage (CUDA machine, brigade-cuda and brigade-fp8 importable)::

    PYTHONPATH=benchmarks/kernels python3 benchmarks/kernels/bench_fp8_w8a8.py --rows 16,32,64,128 --json out.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import multiprocessing

import torch

from bench_attention import copy_bandwidth, graph_time_ms

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
          "down_proj": (4096, 14336)}
NUM_LAYERS = 32


def grid_for(rows: int) -> list[tuple[int, int, int, int, int, int]]:
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    return [(block_m, bn, bk, 4, st, sk) for bn, bk, st, sk in itertools.product((32, 64, 128), (128, 256), (3, 5),
                                                                                  (1, 2, 4))]


def _compile_one(task) -> str | None:
    from brigade_fp8.triton_gemm import w8a8_gemm

    rows, (n, k), tile = task
    qx = torch.randn(rows, k, device="cuda").to(torch.float8_e4m3fn)
    qw = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    try:
        w8a8_gemm(qx, torch.ones(rows, 1, device="cuda"), qw, torch.ones(n, device="cuda"), None, tile=tile)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - out of resources: skipped when timing too
        return type(e).__name__
    return None


def main() -> None:
    from brigade_fp8.quantize import quantize_fp8_per_channel
    from brigade_fp8.triton_gemm import pick_tile, w8a8_gemm
    from brigade_fp8.triton_quant import per_token_quant_fp8

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,32,64,128")
    parser.add_argument("--json")
    parser.add_argument("--compile-workers", type=int, default=14)
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    tasks = [(r, shape, t) for r in rows_list for shape in SHAPES.values() for t in grid_for(r)]
    with concurrent.futures.ProcessPoolExecutor(args.compile_workers,
                                                mp_context=multiprocessing.get_context("spawn")) as pool:
        refused = sum(e is not None for e in pool.map(_compile_one, tasks, chunksize=4))
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    weights = {name: [quantize_fp8_per_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
                      for _ in range(NUM_LAYERS)] for name, (n, k) in SHAPES.items()}
    weights = {name: [(q, s.float().contiguous()) for q, s in ws] for name, ws in weights.items()}
    bound_ms = sum(q.numel() for ws in weights.values() for q, _ in ws) / copy_bw * 1e3
    print(f"compiled {len(tasks)} variants ({refused} refused); copy {copy_bw / 1e9:.0f} GB/s; FP8 bound "
          f"{bound_ms:.3f} ms per step of 128 projections", flush=True)
    record = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": copy_bw, "bound_ms": bound_ms,
              "rows": []}
    print(f"{'rows':>5} {'scaled_mm':>10} {'triton':>8} {'tuned':>8} {'x bound':>8}  best tiles")
    for rows in rows_list:
        row = {"rows": rows, "shapes": {}}
        for name, (n, k) in SHAPES.items():
            qx, sx = per_token_quant_fp8(torch.randn(rows, k, device="cuda", dtype=torch.bfloat16))
            ws = weights[name]

            def timed(call):
                return graph_time_ms([lambda: [call(q, s) for q, s in ws]], 20)

            ref = torch._scaled_mm(qx, ws[0][0].t(), scale_a=sx, scale_b=ws[0][1].reshape(1, -1),
                                   out_dtype=torch.bfloat16).float()
            res = {"scaled_mm_ms": timed(lambda q, s: torch._scaled_mm(qx, q.t(), scale_a=sx, scale_b=s.reshape(1, -1),
                                                                       out_dtype=torch.bfloat16)),
                   "default_ms": timed(lambda q, s: w8a8_gemm(qx, sx, q, s, None)), "trials": []}
            best = (None, float("inf"))
            for tile in grid_for(rows):
                try:
                    out = w8a8_gemm(qx, sx, ws[0][0], ws[0][1], None, tile=tile).float()
                    err = ((out - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        res["trials"].append({"tile": tile, "error": err})
                        continue
                    ms = timed(lambda q, s, t=tile: w8a8_gemm(qx, sx, q, s, None, tile=t))
                except Exception as e:  # noqa: BLE001
                    res["trials"].append({"tile": tile, "error": type(e).__name__})
                    continue
                res["trials"].append({"tile": tile, "ms": ms})
                if ms < best[1]:
                    best = (tile, ms)
            res["best_tile"], res["best_ms"] = best
            res["default_tile"] = pick_tile(rows)
            row["shapes"][name] = res
        for key in ("scaled_mm_ms", "default_ms", "best_ms"):
            row[key] = sum(r[key] for r in row["shapes"].values())
        record["rows"].append(row)
        print(f"{rows:>5} {row['scaled_mm_ms']:>10.3f} {row['default_ms']:>8.3f} {row['best_ms']:>8.3f} "
              f"{min(row['scaled_mm_ms'], row['best_ms']) / bound_ms:>8.2f}  "
              f"{ {n: r['best_tile'] for n, r in row['shapes'].items()} }", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
