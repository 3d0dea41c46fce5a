"""Microbenchmark of brigade-gptq's Triton GEMM against cuBLAS on the dense bf16 weight (Llama-3.1-8B projection
shapes: qkv 4096 -> 6144, o 4096 -> 4096, gate_up 4096 -> 28672, down 14336 -> 4096), 4-bit, group size 128.

For each shape and row count it times (``triton.testing.do_bench``, median) cuBLAS ``F.linear`` on a bf16 weight,
the GPTQ kernel with contiguous groups, and the same weight loaded as act-order (a permuted ``g_idx``) through
``GPTQLinearMethod`` (rows re-stored in group order at load, ``x[:, perm]`` per call); with ``--sweep`` also every
tile of ``TILES`` on the contiguous-group case. The contiguous-group kernel is also timed with ``split_k=1`` (no
split-K; ``choose_split_k`` splits decode-sized batches), and each kernel time is the least of three ``do_bench``
medians (one-row times vary by up to 2x between repeats). Reports microseconds and the packed weight's bytes per
second.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=core:builtin_quant/gptq python benchmarks/kernels/bench_gptq_gemm.py [--sweep] [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton

from brigade.model_executor.layers.linear import Linear
from brigade_gptq.config import GPTQConfig
from brigade_gptq.packing import pack_cols, pack_rows
from brigade_cuda.ops.quant_gemm import choose_split_k, num_sms
from brigade_gptq.triton_gemm import SPLIT_K_MIN_K, choose_tile, gptq_gemm

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
ROWS = (1, 16, 256, 2048)
TILES = [(16, 32, 128, 4, 3), (16, 64, 128, 4, 3), (16, 32, 64, 4, 4), (16, 16, 128, 2, 4), (16, 64, 128, 4, 5),
         (16, 128, 128, 8, 3), (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 128, 32, 4, 4),
         (128, 256, 64, 8, 3), (128, 64, 128, 4, 3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time every tile of TILES")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    for name, (k, n) in SHAPES.items():
        groups = k // 128
        qweight = pack_rows(torch.randint(0, 16, (k, n), device="cuda"), 4)
        qzeros = pack_cols(torch.randint(0, 15, (groups, n), device="cuda"), 4)
        scales = (torch.rand(groups, n, device="cuda") * 0.01 + 1e-3).half()
        g_idx = (torch.arange(k, device="cuda") // 128).to(torch.int32)
        dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        with torch.device("cuda"):
            act = Linear(k, n, dtype=torch.bfloat16,
                         quant_method=GPTQConfig(4, 128, desc_act=True).get_linear_method(name))
        for pname, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales),
                         ("g_idx", g_idx[torch.randperm(k, device="cuda")])):
            getattr(act, pname).data.copy_(t)
        act.quant_method.process_weights_after_loading(act)
        packed_gb = k * n / 2 / 1e9
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            tile = choose_tile(m, n, x.dtype)

            def us(fn):
                return 1e3 * min(triton.testing.do_bench(fn) for _ in range(3))

            row = {"shape": name, "k": k, "n": n, "m": m, "tile": tile,
                   "split_k": choose_split_k(m, n, k, tile[0], tile[1], tile[2], num_sms(x.device), min_k=SPLIT_K_MIN_K),
                   "cublas_bf16_us": us(lambda: F.linear(x, dense)),
                   "gptq_us": us(lambda: gptq_gemm(
                       x, qweight, qzeros, scales, g_idx, bits=4, zero_offset=1, group_size=128, trivial_g_idx=True)),
                   "gptq_split1_us": us(lambda: gptq_gemm(
                       x, qweight, qzeros, scales, g_idx, bits=4, zero_offset=1, group_size=128, trivial_g_idx=True,
                       split_k=1)),
                   "gptq_act_order_us": us(lambda: act(x))}
            row["gptq_packed_gb_s"] = packed_gb / (row["gptq_us"] * 1e-6)
            if args.sweep:
                row["tiles_us"] = {str(tile): 1e3 * triton.testing.do_bench(lambda: gptq_gemm(
                    x, qweight, qzeros, scales, g_idx, bits=4, zero_offset=1, group_size=128, trivial_g_idx=True,
                    tile=tile)) for tile in TILES}
            results.append(row)
            best = min(row.get("tiles_us", {"-": row["gptq_us"]}).items(), key=lambda kv: kv[1])
            print(f"{name:8s} m={m:5d}: cuBLAS bf16 {row['cublas_bf16_us']:8.1f} us | gptq {row['gptq_us']:8.1f} us "
                  f"(split {row['split_k']}; split 1: {row['gptq_split1_us']:8.1f} us) "
                  f"({row['gptq_packed_gb_s']:5.0f} GB/s) | act-order {row['gptq_act_order_us']:8.1f} us | "
                  f"best tile {best[0]} {best[1]:.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
