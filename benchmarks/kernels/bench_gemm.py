"""Skinny-GEMM tile sweep at decode batch sizes on the Llama-3.1-8B projections (bf16), against cuBLAS.

For every weight shape it times ``F.linear`` (cuBLAS) and each (block_n, block_k, num_warps, num_stages)
tile of ``brigade_cuda.ops.gemm`` at one row, keeps the fastest tile whose output matches an fp32 product
(relative error < 1e-2), and reports achieved bandwidth = weight bytes / time against the copy bandwidth
measured in the same run. ``--write-tiles`` saves the winners where the kernel reads them. (The tensor-core
tiles in the table now come from ``tune_skinny_graph.py``, which times them inside a captured decode-like step;
this script's isolated timings are noisy for kernels of 20 us.)

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=core:builtin_platforms/cuda:benchmarks/kernels python benchmarks/kernels/bench_gemm.py \\
        [--json PATH] [--write-tiles builtin_platforms/cuda/brigade_cuda/ops/gemm_tiles.json] [--gemv-only]
        [--model benchmarks/configs/qwen3-30b-a3b]

``--gemv-only`` sweeps only the one-row CUDA-core kernel (``gemv``, tiles in ``GEMV_GRID``), keeps the
tensor-core tiles already in the table, and also sweeps the down projection with SiLU-and-mul folded in
(against ``silu_and_mul`` then the GEMV), whose tile is stored as ``NxK/silu_mul``. With ``--model DIR`` the
shapes are that model's (``model_shapes.decode_gemv_shapes``: attention projections, dense MLP or MoE router, LM
head), and ``--write-tiles`` adds the ones the table lacks; the PYTHONPATH then also needs ``benchmarks``.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from bench_attention import copy_bandwidth
from brigade_cuda.ops.activation import silu_and_mul
from brigade_cuda.ops.gemm import GEMV_TILES, TILES, gemv, skinny_linear

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
          "down_proj": (4096, 14336), "lm_head": (128256, 4096)}
GRID = list(itertools.product([16, 32, 64], [128, 256, 512], [4, 8], [3, 4, 6]))
# (block_n, block_k) pairs whose fp32 partial product fits in registers, x warps x stages
GEMV_GRID = [(bn, bk, w, st) for bn, bk in [(4, 512), (4, 1024), (8, 256), (8, 512), (8, 1024), (16, 256),
                                            (16, 512), (32, 256)] for w in (4, 8) for st in (1, 2, 4)]
DTYPE = torch.bfloat16


def _time(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")  # ms; do_bench flushes L2 between runs


def _best(fn, want, grid, row: dict, label: str):
    """Fastest tile of ``grid`` for ``fn(tile)`` whose output matches ``want``: (tile, ms)."""
    best = None
    for tile in grid:
        try:
            got = fn(tile)
            torch.cuda.synchronize()
        except Exception as e:  # out of shared memory / registers for this tile
            row.setdefault(f"{label}_refused", []).append([list(tile), type(e).__name__])
            continue
        err = ((got.float() - want).abs().max() / want.abs().max()).item()
        if not err < 1e-2:
            row.setdefault(f"{label}_wrong", []).append([list(tile), err])
            continue
        ms = _time(lambda: fn(tile))
        if best is None or ms < best[1]:
            best = (tile, ms)
    return best


def sweep_gemv(copy_bw: float, shapes: dict[str, tuple[int, int]], num_layers: int) -> tuple[dict, dict]:
    """One-row GEMV sweep per shape (and the SiLU-and-mul fold on the down projection)."""
    results, tiles = {}, {}
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device="cuda", dtype=DTYPE) * 0.02
        nbytes = w.numel() * w.element_size()
        x = torch.randn(1, k, device="cuda", dtype=DTYPE)
        want = x.float() @ w.float().T
        row = {"n": n, "k": k, "weight_bytes": nbytes}
        row["cublas_ms_m1"] = _time(lambda: F.linear(x, w))
        tc_tile = TILES.get(f"{n}x{k}")
        row["triton_ms_m1"] = _time(lambda: skinny_linear(x, w, tile=tc_tile))
        tile, ms = _best(lambda t: gemv(x, w, tile=t), want, GEMV_GRID, row, "gemv")
        tiles[f"{n}x{k}"] = list(tile)
        row["gemv_tile"], row["gemv_ms_m1"] = list(tile), ms
        for impl in ("cublas", "triton", "gemv"):
            row[f"{impl}_bw_frac_m1"] = nbytes / (row[f"{impl}_ms_m1"] * 1e-3) / copy_bw
        line = (f"{name:13s} {n}x{k}: cuBLAS {row['cublas_ms_m1'] * 1e3:6.1f} us ({row['cublas_bw_frac_m1']:.0%}) | "
                f"skinny {row['triton_ms_m1'] * 1e3:6.1f} us ({row['triton_bw_frac_m1']:.0%}) | "
                f"gemv {ms * 1e3:6.1f} us ({row['gemv_bw_frac_m1']:.0%}) tile {tile}")
        if name == "down_proj":
            gu = torch.randn(1, 2 * k, device="cuda", dtype=DTYPE)
            want_act = silu_and_mul(gu).float() @ w.float().T
            ftile, fms = _best(lambda t: gemv(gu, w, silu_mul=True, tile=t), want_act, GEMV_GRID, row, "fold")
            row["silu_fold_tile"], row["silu_fold_ms"] = list(ftile), fms
            tiles[f"{n}x{k}/silu_mul"] = list(ftile)
            row["silu_then_gemv_ms"] = _time(lambda: gemv(silu_and_mul(gu), w, tile=tile))
            row["silu_then_skinny_ms"] = _time(lambda: skinny_linear(silu_and_mul(gu), w, tile=tc_tile))
            line += (f" | silu folded {fms * 1e3:.1f} us {ftile} vs silu + gemv {row['silu_then_gemv_ms'] * 1e3:.1f}"
                     f" vs silu + skinny {row['silu_then_skinny_ms'] * 1e3:.1f}")
        print(line, flush=True)
        results[name] = row
        del w
    per_layer = [name for name in shapes if name != "lm_head"]
    for impl in ("cublas", "triton", "gemv"):
        total = (num_layers * sum(results[s][f"{impl}_ms_m1"] for s in per_layer)
                 + results["lm_head"][f"{impl}_ms_m1"])
        print(f"{impl}: all projections of one decode token at m=1: {total:.3f} ms")
    return results, tiles


def write_gemv_tiles(path: str, gemv_tiles: dict, only_new: bool) -> None:
    """Merge ``gemv_tiles`` into the table at ``path``, keeping every other entry (the tensor-core and FP8 tiles);
    with ``only_new``, shapes already there keep their tiles."""
    with open(path) as f:
        table = json.load(f)
    section = table.setdefault("gemv_tiles", {})
    for key, tile in gemv_tiles.items():
        if not (only_new and key in section):
            section[key] = tile
    with open(path, "w") as f:
        json.dump(table, f, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--write-tiles", help="write the winning tiles here (the kernel's gemm_tiles.json)")
    parser.add_argument("--gemv-only", action="store_true", help="sweep only the one-row GEMV kernel")
    parser.add_argument("--model", help="with --gemv-only: a model directory whose config.json gives the shapes "
                        "(model_shapes.decode_gemv_shapes) instead of Llama-3.1-8B's; --write-tiles then adds only "
                        "the shapes the table lacks")
    args = parser.parse_args()
    if args.model and not args.gemv_only:
        parser.error("--model needs --gemv-only")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    if args.gemv_only:
        shapes, num_layers = SHAPES, 32
        if args.model:
            from model_shapes import decode_gemv_shapes, load_config

            config = load_config(args.model)
            shapes, num_layers = decode_gemv_shapes(config), config["num_hidden_layers"]
        results, gemv_tiles = sweep_gemv(copy_bw, shapes, num_layers)
        record = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": copy_bw,
                  "dtype": str(DTYPE), "gemv_grid": GEMV_GRID, "shapes": results}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=2)
        if args.write_tiles:
            write_gemv_tiles(args.write_tiles, gemv_tiles, only_new=bool(args.model))
        return
    results, tiles = {}, {}
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=DTYPE) * 0.02
        nbytes = w.numel() * w.element_size()
        row = {"n": n, "k": k, "weight_bytes": nbytes}
        for m in (1, 4, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            row[f"cublas_ms_m{m}"] = _time(lambda: F.linear(x, w))
        x = torch.randn(1, k, device="cuda", dtype=DTYPE)
        want = (x.float() @ w.float().T)
        best = None
        for tile in GRID:
            try:
                got = skinny_linear(x, w, tile=tile)
                torch.cuda.synchronize()
            except Exception as e:  # out of shared memory / registers for this tile
                row.setdefault("refused", []).append([list(tile), type(e).__name__])
                continue
            err = ((got.float() - want).abs().max() / want.abs().max()).item()
            if not err < 1e-2:
                row.setdefault("wrong", []).append([list(tile), err])
                continue
            ms = _time(lambda: skinny_linear(x, w, tile=tile))
            if best is None or ms < best[1]:
                best = (tile, ms)
        tile, ms = best
        tiles[f"{n}x{k}"] = list(tile)
        row["best_tile"], row["triton_ms_m1"] = list(tile), ms
        for m in (4, 8, 16):
            xm = torch.randn(m, k, device="cuda", dtype=DTYPE)
            row[f"triton_ms_m{m}"] = _time(lambda: skinny_linear(xm, w, tile=tile))
        row["cublas_bw_frac_m1"] = nbytes / (row["cublas_ms_m1"] * 1e-3) / copy_bw
        row["triton_bw_frac_m1"] = nbytes / (ms * 1e-3) / copy_bw
        results[name] = row
        print(f"{name:13s} {n}x{k}: cuBLAS {row['cublas_ms_m1'] * 1e3:7.1f} us ({row['cublas_bw_frac_m1']:.0%}) | "
              f"triton {ms * 1e3:7.1f} us ({row['triton_bw_frac_m1']:.0%}) tile {tile} | m=8 cuBLAS "
              f"{row['cublas_ms_m8'] * 1e3:.1f} triton {row['triton_ms_m8'] * 1e3:.1f} | m=16 cuBLAS "
              f"{row['cublas_ms_m16'] * 1e3:.1f} triton {row['triton_ms_m16'] * 1e3:.1f}", flush=True)
        del w
    per_layer = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    for impl in ("cublas", "triton"):
        total = 32 * sum(results[s][f"{impl}_ms_m1"] for s in per_layer) + results["lm_head"][f"{impl}_ms_m1"]
        print(f"{impl}: all projections of one decode token at m=1: {total:.3f} ms")
    record = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": copy_bw, "dtype": str(DTYPE),
              "grid": GRID, "shapes": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    if args.write_tiles:
        with open(args.write_tiles, "w") as f:
            json.dump({"device": record["device"], "measured_by": "benchmarks/kernels/bench_gemm.py", "tiles": tiles,
                       "gemv_tiles": {k: list(v) for k, v in GEMV_TILES.items()}}, f, indent=2)


if __name__ == "__main__":
    main()
