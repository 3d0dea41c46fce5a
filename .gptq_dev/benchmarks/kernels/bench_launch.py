"""What one more kernel costs inside a captured decode graph: replay time of a chain of tiny kernels.

A batch-1 decode step is a few hundred kernels; most of the small ones move a few kilobytes, so their cost
is the boundary itself (launch, ramp, drain), not their work. This captures chains of ``fused_add_rms_norm``
on one 4096-wide row (16 KB moved) with and without programmatic dependent launch and reports the replay
time per kernel: the price of every kernel a fusion removes.

Usage (CUDA machine)::

    PYTHONPATH=core:builtin_platforms/cuda python benchmarks/kernels/bench_launch.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os

import torch


def per_kernel_us(chain_len: int, pdl: bool) -> float:
    os.environ["BRIGADE_CUDA_PDL"] = "1" if pdl else "0"
    from brigade_cuda import pdl as pdl_mod

    pdl_mod.pdl_enabled.cache_clear()
    from brigade_cuda.ops import fused_add_rms_norm

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    fused_add_rms_norm(x, r, w, 1e-5)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(chain_len):
            fused_add_rms_norm(x, r, w, 1e-5)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / chain_len)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(), "kernel": "fused_add_rms_norm 1x4096 bf16"}
    for pdl in (False, True):
        for n in (32, 320):
            us = per_kernel_us(n, pdl)
            result[f"us_per_kernel_chain{n}_pdl{int(pdl)}"] = us
            print(f"chain of {n:3d}, PDL {'on ' if pdl else 'off'}: {us:.2f} us per kernel", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
