"""Microbenchmark of the fused Triton ops at Llama-3.1-8B shapes (bf16): achieved bandwidth against the
copy bandwidth measured in the same run, and the PyTorch ``forward_native`` of each layer as the peer.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=core:builtin_platforms/cuda python benchmarks/kernels/bench_ops.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from bench_attention import copy_bandwidth
from brigade.model_executor.layers.activation import SiluAndMul
from brigade.model_executor.layers.layernorm import RMSNorm
from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding
from brigade_cuda.ops import fused_add_rms_norm, rotary_embedding, silu_and_mul

NUM_TOKENS, HIDDEN, INTERMEDIATE, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 4096, 4096, 14336, 32, 8, 128
DTYPE = torch.bfloat16


def _time(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    rows = []
    elt = torch.finfo(DTYPE).bits // 8

    norm = RMSNorm(HIDDEN, 1e-5, dtype=DTYPE).cuda()
    x = torch.randn(NUM_TOKENS, HIDDEN, device="cuda", dtype=DTYPE)
    residual = torch.randn_like(x)
    rows.append(("fused_add_rms_norm", 4 * x.numel() * elt,  # read x, residual; write both
                 _time(lambda: fused_add_rms_norm(x, residual, norm.weight, 1e-5)),
                 _time(lambda: norm.forward_native(x, residual))))

    gate_up = torch.randn(NUM_TOKENS, 2 * INTERMEDIATE, device="cuda", dtype=DTYPE)
    act = SiluAndMul()
    rows.append(("silu_and_mul", 3 * NUM_TOKENS * INTERMEDIATE * elt, _time(lambda: silu_and_mul(gate_up)),
                 _time(lambda: act.forward_native(gate_up))))

    rope = RotaryEmbedding(HEAD_SIZE, HEAD_SIZE, 8192, RopeParameters(rope_theta=500000.0)).cuda()
    qkv = torch.randn(NUM_TOKENS, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_SIZE, device="cuda", dtype=DTYPE)
    q, k = qkv[:, : NUM_HEADS * HEAD_SIZE], qkv[:, NUM_HEADS * HEAD_SIZE: (NUM_HEADS + NUM_KV_HEADS) * HEAD_SIZE]
    positions = torch.randint(0, 8192, (NUM_TOKENS,), device="cuda")
    rows.append(("rotary_embedding", 2 * (q.numel() + k.numel()) * elt,  # read and write q, k in place
                 _time(lambda: rotary_embedding(positions, q, k, HEAD_SIZE, rope.cos_sin_cache)),
                 _time(lambda: rope.forward_native(positions, q, k))))

    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; {NUM_TOKENS} tokens, bf16")
    print(f"{'op':>20} {'MB':>7} {'triton us':>9} {'GB/s':>6} {'of copy':>7} {'native us':>9} {'speedup':>7}")
    results = {"copy_bandwidth_GBps": copy_bw / 1e9, "num_tokens": NUM_TOKENS, "ops": []}
    for name, nbytes, ms, native_ms in rows:
        bw = nbytes / (ms * 1e-3)
        print(f"{name:>20} {nbytes / 1e6:>7.1f} {ms * 1e3:>9.1f} {bw / 1e9:>6.0f} {bw / copy_bw:>7.1%} "
              f"{native_ms * 1e3:>9.1f} {native_ms / ms:>6.1f}x")
        results["ops"].append({"op": name, "bytes": nbytes, "ms": ms, "GBps": bw / 1e9, "native_ms": native_ms})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
