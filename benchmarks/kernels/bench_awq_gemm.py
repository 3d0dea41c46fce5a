"""Microbenchmark of brigade-awq's Triton GEMM against the PyTorch dequantize-then-matmul path and a dense bf16
``torch.matmul``, on Llama-3.1-8B projection shapes (K x N: qkv 4096 x 6144, o 4096 x 4096, gate_up 4096 x 28672,
down 14336 x 4096), 4-bit AWQ, group size 128, bf16 activations, M = 1, 8, 64, 2048 rows.

Each timing is the median of ``--reps`` CUDA-event measurements of one call, with the L2 cache flushed (a 256 MiB
buffer zeroed) before each, so that a packed weight smaller than the L2 is not read from it. Per shape and row
count it reports microseconds for:

* ``bf16_matmul_us``: ``x @ W`` on the dense bf16 weight (cuBLAS);
* ``awq_triton_us``: ``awq_gemm`` with its own tile and split-K choice (``tile``, ``split_k`` in the row), and
  ``awq_triton_split1_us`` with split-K off (decode rows only, where the choice is not 1);
* ``awq_layer_us``: the same kernel through an AWQ ``Linear`` layer (the method's dispatch included);
* ``awq_torch_dequant_us``: the layer's PyTorch path (``BRIGADE_AWQ_TRITON=0``): dequantize to bf16, matmul;

and the packed weight's bytes per second for the kernel. With ``--sweep`` also every tile of ``TILES`` (and for
decode rows every split of ``SPLITS``) as ``tiles_us``. Prints one JSON document (a list of rows) on stdout,
progress on stderr.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=core:builtin_quant/awq python benchmarks/kernels/bench_awq_gemm.py [--sweep] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from brigade.model_executor.layers.linear import Linear
from brigade_awq.config import AWQConfig
from brigade_awq.packing import dequantize, pack
from brigade_awq.triton_gemm import awq_gemm, block_k_for_groups, choose_split_k, choose_tile, num_sms

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
ROWS = (1, 8, 64, 2048)
GROUP_SIZE = 128
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): brigade-gptq's sweep, which choose_tile picks among.
TILES = [(16, 32, 128, 4, 3), (16, 64, 128, 4, 3), (16, 32, 64, 4, 4), (16, 16, 128, 2, 4), (16, 64, 128, 4, 5),
         (16, 128, 128, 8, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 128, 32, 4, 4),
         (128, 256, 64, 8, 3), (128, 64, 128, 4, 3)]
SPLITS = (1, 2, 4, 8)


def time_us(fn, flush: torch.Tensor, reps: int, warmup: int = 3) -> float:
    """Median microseconds of one ``fn()`` over ``reps`` CUDA-event measurements, L2 flushed before each."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def awq_layer(k: int, n: int, qweight, qzeros, scales, name: str) -> Linear:
    """An AWQ ``Linear`` on CUDA holding the given packed tensors (its kernel bound as serving binds it)."""
    with torch.device("cuda"):
        layer = Linear(k, n, dtype=torch.bfloat16,
                       quant_method=AWQConfig(4, GROUP_SIZE).get_linear_method(f"model.layers.0.{name}"))
    for pname, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        getattr(layer, pname).data.copy_(t)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time every tile of TILES (and SPLITS)")
    parser.add_argument("--reps", type=int, default=50, help="measurements per timing (median)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    results = []
    for name, (k, n) in SHAPES.items():
        groups = k // GROUP_SIZE
        qweight = pack(torch.randint(0, 16, (k, n), device="cuda"))
        qzeros = pack(torch.randint(0, 16, (groups, n), device="cuda"))
        scales = (torch.rand(groups, n, device="cuda") * 0.01 + 1e-3).half()
        dense = dequantize(qweight, qzeros, scales, group_size=GROUP_SIZE, dtype=torch.bfloat16)  # [K, N]
        layer = awq_layer(k, n, qweight, qzeros, scales, name)
        assert layer.quant_method.gemm is awq_gemm, "the layer did not bind the kernel (BRIGADE_AWQ_TRITON=0?)"
        packed_gb = (qweight.numel() * 4 + qzeros.numel() * 4 + scales.numel() * 2) / 1e9
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            tile = choose_tile(m, n, x.dtype)
            block_k, _ = block_k_for_groups(tile[2], GROUP_SIZE, groups)
            split = choose_split_k(m, n, k, tile[0], tile[1], block_k, num_sms(x.device))
            row = {"shape": name, "k": k, "n": n, "m": m, "tile": tile, "split_k": split,
                   "bf16_matmul_us": time_us(lambda: torch.matmul(x, dense), flush, args.reps),
                   "awq_triton_us": time_us(lambda: awq_gemm(x, qweight, qzeros, scales, group_size=GROUP_SIZE),
                                            flush, args.reps)}
            if split != 1:
                row["awq_triton_split1_us"] = time_us(
                    lambda: awq_gemm(x, qweight, qzeros, scales, group_size=GROUP_SIZE, split_k=1), flush, args.reps)
            row["awq_layer_us"] = time_us(lambda: layer(x), flush, args.reps)
            layer.quant_method.gemm = None  # the PyTorch path, as BRIGADE_AWQ_TRITON=0 builds it
            row["awq_torch_dequant_us"] = time_us(lambda: layer(x), flush, max(5, args.reps // 5))
            layer.quant_method.gemm = awq_gemm
            row["awq_packed_gb_s"] = packed_gb / (row["awq_triton_us"] * 1e-6)
            if args.sweep:
                splits = SPLITS if m <= 16 else (1,)
                row["tiles_us"] = {f"{tile_}/split{s}": time_us(lambda: awq_gemm(
                    x, qweight, qzeros, scales, group_size=GROUP_SIZE, tile=tile_, split_k=s), flush, args.reps)
                    for tile_ in TILES for s in splits}
            results.append(row)
            best = min(row.get("tiles_us", {"-": row["awq_triton_us"]}).items(), key=lambda kv: kv[1])
            print(f"{name:8s} m={m:5d}: bf16 {row['bf16_matmul_us']:8.1f} us | awq {row['awq_triton_us']:8.1f} us "
                  f"(split {split}: {row['awq_packed_gb_s']:5.0f} GB/s"
                  + (f", split 1 {row['awq_triton_split1_us']:.1f} us" if "awq_triton_split1_us" in row else "")
                  + f") | layer {row['awq_layer_us']:8.1f} us | torch dequant {row['awq_torch_dequant_us']:9.1f} us"
                  f" | best tile {best[0]} {best[1]:.1f} us", file=sys.stderr, flush=True)
        del dense, layer
        torch.cuda.empty_cache()
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
