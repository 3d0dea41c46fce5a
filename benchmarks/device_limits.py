"""The physical limits the headline benchmarks are judged against, measured on this device in this run.

* ``copy_bandwidth_GBps``: median device-to-device copy bandwidth (bytes read + bytes written), as
  ``brigade.benchmarks.roofline`` measures it.
* ``weight_bytes`` and ``bound_tpot_ms``: the bytes of weights one batch-1 decode step reads (every parameter, one
  row of an untied embedding table) and that over the copy bandwidth, the floor of batch-1 TPOT.
* ``matmul_tflops``: median dense ``[n, n] @ [n, n]`` throughput in the model's dtype (``--matmul-size``, CUDA events).
* ``flops_per_token`` and ``bound_total_tokens_per_s``: ``2 x`` the parameters a token multiplies by (every
  weight but the embedding table; attention's own FLOPs left out) and the matmul peak over it, the ceiling of
  total (prompt + output) tokens/s of a compute-bound run such as bench 2.

Off CUDA the measured fields are ``null`` (the model is still built on the meta device, so the shape-derived
fields are filled). Prints one JSON object; ``--json PATH`` also writes it.

Usage::

    python benchmarks/device_limits.py benchmarks/configs/llama-3.1-8b [--json limits.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from brigade.benchmarks.roofline import decode_weight_bytes, measure_copy_bandwidth


def matmul_tflops(dtype: torch.dtype, n: int = 8192, repeats: int = 20) -> float | None:
    """Median dense n x n x n matmul throughput in TFLOP/s on the current CUDA device, or None off CUDA."""
    if not torch.cuda.is_available():
        return None
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters a token is multiplied by: every parameter except the embedding table (kept if tied to the head)."""
    embed = getattr(getattr(model, "model", model), "embed_tokens", None)
    embed_ids = {id(p) for p in embed.parameters()} if embed is not None else set()
    lm_head = getattr(model, "lm_head", None)
    tied = lm_head is not None and any(id(p) in embed_ids for p in lm_head.parameters())
    return sum(p.numel() for p in model.parameters() if tied or id(p) not in embed_ids)


def build_meta_model(model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
    """The model's module tree on the meta device (shapes only, no memory)."""
    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.model_executor.loader import get_hf_config
    from brigade.plugins import load_plugins, registries

    load_plugins("engine")
    hf_config = get_hf_config(model_dir)
    with torch.device("meta"):
        return registries.models.get(hf_config.architectures[0])(
            hf_config, dtype=dtype, attn_backend=ReferenceAttentionBackend)


def device_limits(model_dir: str, dtype_name: str = "bfloat16", matmul_size: int = 8192) -> dict:
    """Every field of the module docstring, as a dict (measured fields None off CUDA)."""
    dtype = getattr(torch, dtype_name)
    model = build_meta_model(model_dir, dtype)
    weight_bytes = decode_weight_bytes(model)
    flops_per_token = 2 * matmul_params(model)
    on_cuda = torch.cuda.is_available()
    bandwidth = measure_copy_bandwidth(torch.device("cuda")) if on_cuda else None
    tflops = matmul_tflops(dtype, matmul_size)
    return {
        "model": model_dir,
        "dtype": dtype_name,
        "device_name": torch.cuda.get_device_name() if on_cuda else None,
        "weight_bytes": weight_bytes,
        "copy_bandwidth_GBps": None if bandwidth is None else bandwidth / 1e9,
        "bound_tpot_ms": None if bandwidth is None else weight_bytes / bandwidth * 1e3,
        "matmul_size": matmul_size,
        "matmul_tflops": tflops,
        "flops_per_token": flops_per_token,
        "bound_total_tokens_per_s": None if tflops is None else tflops * 1e12 / flops_per_token,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/device_limits.py", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a model directory with config.json (weights are not read)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--matmul-size", type=int, default=8192, help="n of the n x n x n matmul (default %(default)s)")
    parser.add_argument("--json", default=None, help="also write the JSON object to this path")
    args = parser.parse_args(argv)
    result = device_limits(args.model, args.dtype, args.matmul_size)
    text = json.dumps(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
