"""Fused MoE kernel time per token count: brigade-cuda's Triton kernel against the PyTorch reference path and a
loop of dense cuBLAS GEMMs over the experts, at Mixtral-8x7B's and Qwen3-30B-A3B's expert shapes (bf16).

For each shape and token count it times, with fresh random tokens and routes (softmax top-k over random logits):

* ``fused``: ``brigade_cuda.ops.fused_moe.fused_moe`` (align + gate/up GEMM with SiLU-and-mul + down GEMM with the
  router weights + the sum over the top-k), with the tile ``pick_tile`` gives (or each tile of ``--tune``);
* ``reference``: ``fused_moe_reference``, the CPU path's PyTorch code (``FusedMoE.forward_native``) on the GPU;
* ``dense_loop``: per expert, ``F.linear`` gate/up, ``silu_and_mul``, ``F.linear`` down and the weighted
  ``index_add_``, with each expert's token lists computed on the host before timing (the loop's best case: no
  sorting, no synchronization inside the timed region);

and reports, beside the milliseconds, the bytes of the active experts' weights over the time (against the copy
bandwidth measured in the same run: the bound at decode sizes) and TFLOP/s on the routed tokens (the bound at
prefill sizes). Each fused output is checked against the reference first (relative error < 1e-2).

``--fp8`` runs the same cases on FP8 experts (``--quantization fp8``'s layout: ``float8_e4m3fn`` with one fp32
scale per expert and output channel, quantized as ``brigade_fp8.moe_method`` does): the fused kernel's W8A16
variant and the reference on the FP8 weights (relative error < 2e-2), the dense loop on the dequantized bf16
weights; the bandwidth fraction counts one byte per weight.

Usage (on a CUDA machine, from the repository root)::

    source benchmarks/gpu_setup.sh
    PYTHONPATH=core:builtin_platforms/cuda:builtin_quant/fp8:benchmarks/kernels \\
        python benchmarks/kernels/bench_fused_moe.py [--fp8] \\
        [--tokens 1,8,64,512,4096] [--shapes mixtral-8x7b,qwen3-30b-a3b] [--json PATH] \\
        [--tune [--write-tiles builtin_platforms/cuda/brigade_cuda/ops/moe_tiles.json]]

``--tune`` sweeps ``TUNE_GRID`` (row blocks up to twice the mean tokens per expert) for every shape and token count
and keeps the fastest correct tile (a few minutes per shape: give ``--shapes`` one at a time within a 10-minute call);
``--write-tiles`` saves the winners where the kernel reads them, replacing only the shapes it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from bench_attention import copy_bandwidth
from brigade.model_executor.layers.fused_moe import fused_moe_reference
from brigade.model_executor.layers.moe_router import select_experts
from brigade_cuda.ops.activation import silu_and_mul
from brigade_cuda.ops.fused_moe import MoETile, fused_moe, pick_tile, tile_key

# name -> (experts, hidden, intermediate, top_k), from benchmarks/configs/<name>/config.json
SHAPES = {"mixtral-8x7b": (8, 4096, 14336, 2), "qwen3-30b-a3b": (128, 2048, 768, 8)}
TUNE_GRID = [MoETile(bm, bn, bk, gm, 4 if bm * bn <= 4096 else 8, st) for bm, bn, bk, gm, st in itertools.product(
    [16, 32, 64, 128], [32, 64, 128], [64, 128], [1, 8], [3, 4])]
DTYPE = torch.bfloat16


def _time(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")  # ms; flushes L2 between runs


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def tune_tiles(tokens_per_expert: float) -> list[MoETile]:
    """``TUNE_GRID`` without row blocks over twice the mean tokens per expert (mostly padding)."""
    return [t for t in TUNE_GRID if t.block_m <= max(16, 2 * tokens_per_expert)]


def dense_loop(x, w13, w2, weights, routes):
    """The per-expert loop with host-side token lists ``routes``: [(expert, tokens, slots)]."""
    out = torch.zeros_like(x, dtype=torch.float32)
    for expert, tokens, slots in routes:
        act = silu_and_mul(F.linear(x[tokens], w13[expert]))
        y = F.linear(act, w2[expert]).float() * weights[tokens, slots, None]
        out.index_add_(0, tokens, y)
    return out.to(x.dtype)


def host_routes(ids: torch.Tensor) -> list:
    """Each expert's tokens and top-k slots, as device index tensors built before timing."""
    ids_host = ids.cpu()
    routes = []
    for expert in ids_host.unique().tolist():
        tokens, slots = (ids_host == expert).nonzero(as_tuple=True)
        routes.append((expert, tokens.cuda(), slots.cuda()))
    return routes


def case(name: str, num_tokens: int, w13, w2, copy_bw: float, tune: bool, scales=None,
         dense=None) -> tuple[dict, MoETile]:
    """One shape and token count; ``scales`` (w13's [E, 2I], w2's [E, H]) with FP8 ``w13``/``w2``, whose
    dequantized bf16 weights ``dense`` the dense loop multiplies."""
    num_experts, hidden, inter, top_k = SHAPES[name]
    fp8 = {} if scales is None else {"w13_scale": scales[0], "w2_scale": scales[1]}
    limit = 1e-2 if scales is None else 2e-2
    dense_w13, dense_w2 = dense or (w13, w2)
    gen = torch.Generator(device="cuda").manual_seed(num_tokens)
    x = torch.randn(num_tokens, hidden, device="cuda", generator=gen).to(DTYPE)
    weights, ids = select_experts(torch.randn(num_tokens, num_experts, device="cuda", generator=gen), top_k, True)
    ref = fused_moe_reference(x, w13, w2, weights, ids, **fp8)
    active = ids.unique().numel()
    weight_bytes = active * 3 * hidden * inter * w13.element_size()
    flops = 2 * num_tokens * top_k * 3 * hidden * inter
    row = {"shape": name, "tokens": num_tokens, "active_experts": active, "active_weight_bytes": weight_bytes}
    tiles = tune_tiles(num_tokens * top_k / num_experts) if tune else [
        pick_tile(num_tokens, num_experts, hidden, inter, top_k)]
    best = None
    for tile in tiles:
        try:
            err = _rel_err(fused_moe(x, w13, w2, weights, ids, tile=tile, **fp8), ref)
        except Exception as e:  # out of shared memory or registers for this tile
            row.setdefault("refused", []).append([list(tile), type(e).__name__])
            continue
        if not err < limit:
            row.setdefault("wrong", []).append([list(tile), err])
            continue
        ms = _time(lambda: fused_moe(x, w13, w2, weights, ids, tile=tile, **fp8))
        if best is None or ms < best[1]:
            best = (tile, ms, err)
    if best is None:
        raise RuntimeError(f"{name} at {num_tokens} tokens: no tile gave a correct result: {row}")
    tile, fused_ms, err = best
    routes = host_routes(ids)
    assert _rel_err(dense_loop(x, dense_w13, dense_w2, weights, routes), ref) < limit
    row.update(tile=list(tile), rel_err=err, fused_ms=fused_ms,
               reference_ms=_time(lambda: fused_moe_reference(x, w13, w2, weights, ids, **fp8)),
               dense_loop_ms=_time(lambda: dense_loop(x, dense_w13, dense_w2, weights, routes)))
    row["fused_bandwidth_fraction"] = weight_bytes / (fused_ms * 1e-3) / copy_bw
    row["fused_tflops"] = flops / (fused_ms * 1e-3) / 1e12
    row["speedup_vs_reference"] = row["reference_ms"] / fused_ms
    row["speedup_vs_dense_loop"] = row["dense_loop_ms"] / fused_ms
    return row, tile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,8,64,512,4096", help="comma-separated token counts")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--tune", action="store_true", help="sweep TUNE_GRID and keep the fastest correct tile")
    parser.add_argument("--fp8", action="store_true", help="FP8 experts (W8A16), per-channel scales")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--write-tiles", help="write the winning tiles here (the kernel's moe_tiles.json)")
    args = parser.parse_args()
    if args.fp8 and args.write_tiles:
        parser.error("--write-tiles with --fp8: the tile table is keyed by shape and tuned in bf16")
    copy_bw = copy_bandwidth()
    record = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": copy_bw,
              "experts": "fp8" if args.fp8 else "bf16", "rows": []}
    tiles: dict[str, dict[str, list[int]]] = {}
    print(f"{'shape':>14} {'tokens':>6} {'fused ms':>9} {'ref ms':>9} {'loop ms':>9} {'x ref':>6} {'x loop':>6} "
          f"{'bw frac':>7} {'TFLOP/s':>7}  tile")
    for name in args.shapes.split(","):
        num_experts, hidden, inter, top_k = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        w13 = (torch.randn(num_experts, 2 * inter, hidden, device="cuda", generator=gen) / hidden ** 0.5).to(DTYPE)
        w2 = (torch.randn(num_experts, hidden, inter, device="cuda", generator=gen) / inter ** 0.5).to(DTYPE)
        scales = dense = None
        if args.fp8:
            from brigade_fp8.moe_method import quantize_by_expert
            from brigade_fp8.quantize import fp8_scale_from_amax

            scales = fp8_scale_from_amax(w13.abs().amax(dim=2)), fp8_scale_from_amax(w2.abs().amax(dim=2))
            w13, w2 = quantize_by_expert(w13, scales[0]), quantize_by_expert(w2, scales[1])
            dense = tuple((w.to(DTYPE) * s[..., None].to(DTYPE)) for w, s in zip((w13, w2), scales))
        for num_tokens in (int(t) for t in args.tokens.split(",")):
            row, tile = case(name, num_tokens, w13, w2, copy_bw, args.tune, scales, dense)
            record["rows"].append(row)
            tiles.setdefault(tile_key(num_experts, hidden, inter, top_k), {})[str(num_tokens)] = list(tile)
            print(f"{name:>14} {num_tokens:>6} {row['fused_ms']:>9.4f} {row['reference_ms']:>9.4f} "
                  f"{row['dense_loop_ms']:>9.4f} {row['speedup_vs_reference']:>6.1f} "
                  f"{row['speedup_vs_dense_loop']:>6.2f} {row['fused_bandwidth_fraction']:>7.2f} "
                  f"{row['fused_tflops']:>7.1f}  {row['tile']}", flush=True)
        del w13, w2, dense
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    if args.write_tiles:  # merged into the file's other shapes, so shapes can be tuned one call at a time
        try:
            with open(args.write_tiles) as f:
                tiles = {**json.load(f).get("tiles", {}), **tiles}
        except FileNotFoundError:
            pass
        with open(args.write_tiles, "w") as f:
            json.dump({"device": record["device"], "measured_by": "benchmarks/kernels/bench_fused_moe.py --tune",
                       "format": "shape key (E, H, I, top_k) -> {token count: [block_m, block_n, block_k, group_m, "
                                 "num_warps, num_stages]}; a step of T tokens takes the smallest listed count >= T",
                       "tiles": tiles}, f, indent=2)


if __name__ == "__main__":
    main()
