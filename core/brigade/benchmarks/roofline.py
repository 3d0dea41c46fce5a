"""Physical limits a benchmark is judged against: measured copy bandwidth and the batch-1 decode bound.

Batch-1 decode reads every weight once per token (except the embedding table, of which it reads one row),
so its time per output token is at least ``weight bytes / memory bandwidth``. The bandwidth is measured in
the same run with a device-to-device copy (read + write), so the bound is this device's, not a datasheet's.
"""

from __future__ import annotations

import torch


def measure_copy_bandwidth(device: torch.device, num_bytes: int = 2 << 30, repeats: int = 20) -> float | None:
    """Median device copy bandwidth in bytes/s (bytes read + bytes written), or None off CUDA."""
    if device.type != "cuda":
        return None
    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    del src, dst
    torch.cuda.empty_cache()
    return num_bytes / times[len(times) // 2]


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter, but only one row of an untied embedding."""
    total = 0
    embed = getattr(getattr(model, "model", model), "embed_tokens", None)
    embed_params = {id(p) for p in embed.parameters()} if embed is not None else set()
    lm_head = getattr(model, "lm_head", None)
    tied = lm_head is not None and any(id(p) in embed_params for p in lm_head.parameters())
    for p in model.parameters():
        if id(p) in embed_params and not tied:
            total += p[0].numel() * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total


def decode_bound_s(model: torch.nn.Module, device: torch.device) -> dict | None:
    """{"copy_bandwidth_GBps", "weight_bytes", "bound_tpot_ms"} for batch-1 decode, or None off CUDA."""
    bandwidth = measure_copy_bandwidth(device)
    if bandwidth is None:
        return None
    weight_bytes = decode_weight_bytes(model)
    return {"copy_bandwidth_GBps": bandwidth / 1e9, "weight_bytes": weight_bytes,
            "bound_tpot_ms": weight_bytes / bandwidth * 1e3}


def main(argv: list[str] | None = None) -> None:
    """``python -m brigade.benchmarks.roofline MODEL_DIR``: print the batch-1 decode bound as JSON.

    The model is built on the meta device (no memory, no weights), so only its parameter shapes count.
    """
    import argparse
    import json

    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.model_executor.loader import get_hf_config
    from brigade.plugins import load_plugins, registries

    parser = argparse.ArgumentParser(prog="python -m brigade.benchmarks.roofline")
    parser.add_argument("model")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    load_plugins("engine")
    hf_config = get_hf_config(args.model)
    with torch.device("meta"):
        model = registries.models.get(hf_config.architectures[0])(
            hf_config, dtype=getattr(torch, args.dtype), attn_backend=ReferenceAttentionBackend)
    weight_bytes = decode_weight_bytes(model)
    bandwidth = measure_copy_bandwidth(torch.device("cuda")) if torch.cuda.is_available() else None
    result = {"model": args.model, "weight_bytes": weight_bytes,
              "copy_bandwidth_GBps": None if bandwidth is None else bandwidth / 1e9,
              "bound_tpot_ms": None if bandwidth is None else weight_bytes / bandwidth * 1e3}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
