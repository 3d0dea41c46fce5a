"""FP8 products of decode batches: ``torch._scaled_mm`` as is, and with its operands swapped, per batch size.

The four projections of 32 Llama-3.1-8B layers (distinct FP8 weights, 7.0 GB, so L2 never serves them) at each
``--rows`` count, captured in a CUDA graph and replayed, per-token quantized activations prepared beforehand:
``_scaled_mm(qx, qw.t())`` (what ``fp8_gemm_cuda`` runs without ``BRIGADE_FP8_SWAP_AB_ROWS``), the swapped form
``scaled_mm_swap_ab`` (``(qw @ qx.t()).t()``, with its transpose copy), and bf16 ``F.linear`` on bf16 weights.
Bound: the FP8 weight bytes over the copy bandwidth measured in the same run. The swapped result is checked
against the plain one (relative error below 1e-2).

Usage (CUDA machine, brigade-fp8 importable)::

    PYTHONPATH=benchmarks/kernels python3 benchmarks/kernels/bench_fp8_swap_ab.py --rows 8,16,32,64,128,256 \\
        --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bench_attention import copy_bandwidth, graph_time_ms
from brigade_fp8.gemm import scaled_mm_swap_ab
from brigade_fp8.quantize import quantize_fp8_per_channel
from brigade_fp8.triton_quant import per_token_quant_fp8

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
          "down_proj": (4096, 14336)}
NUM_LAYERS = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="8,16,32,64,128,256")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    fp8, bf16 = {}, {}
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(NUM_LAYERS)]
        fp8[name] = [quantize_fp8_per_channel(w) for w in ws]
        fp8[name] = [(q, s.reshape(1, -1).float().contiguous()) for q, s in fp8[name]]
        bf16[name] = ws
    weight_bytes = sum(q.numel() for ws in fp8.values() for q, _ in ws)
    bound_ms = weight_bytes / copy_bw * 1e3
    record = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": copy_bw,
              "fp8_weight_bytes": weight_bytes, "bound_ms": bound_ms, "rows": []}
    print(f"copy {copy_bw / 1e9:.0f} GB/s, FP8 bound {bound_ms:.3f} ms per step of 128 projections")
    print(f"{'rows':>5} {'scaled_mm':>10} {'swapped':>9} {'bf16':>8} {'x bound':>8}")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {name: torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
        qxs = {name: per_token_quant_fp8(x) for name, x in xs.items()}
        for name in SHAPES:  # the swapped product equals the plain one
            (qx, sx), (qw, sw) = qxs[name], fp8[name][0]
            plain = torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
            swapped = scaled_mm_swap_ab(qx, sx, qw, sw, None)
            err = ((swapped.float() - plain.float()).norm() / plain.float().norm()).item()
            assert swapped.is_contiguous() and err < 1e-2, (rows, name, err)

        def step(call):
            return [lambda: [call(name, layer) for layer in range(NUM_LAYERS) for name in SHAPES]]

        def plain(name, layer):
            (qx, sx), (qw, sw) = qxs[name], fp8[name][layer]
            return torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)

        def swap(name, layer):
            (qx, sx), (qw, sw) = qxs[name], fp8[name][layer]
            return scaled_mm_swap_ab(qx, sx, qw, sw, None)

        def dense(name, layer):
            return F.linear(xs[name], bf16[name][layer])

        row = {"rows": rows, "scaled_mm_ms": graph_time_ms(step(plain), 20),
               "swapped_ms": graph_time_ms(step(swap), 20), "bf16_ms": graph_time_ms(step(dense), 20)}
        record["rows"].append(row)
        print(f"{rows:>5} {row['scaled_mm_ms']:>10.3f} {row['swapped_ms']:>9.3f} {row['bf16_ms']:>8.3f} "
              f"{min(row['scaled_mm_ms'], row['swapped_ms']) / bound_ms:>8.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
