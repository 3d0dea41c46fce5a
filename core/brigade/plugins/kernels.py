"""The kernel registry: which function serves which core op on which platform, filled by ``register_kernels``.

The core's layers have a portable PyTorch path for every op; a platform plugin registers faster functions for
some of them. A registration is keyed by ``(op, platform)`` and stored in ``registries.kernels`` under the
name ``"op@platform"``, so two distributions registering the same op for the same platform is the registry's
usual DuplicateNameError naming both (unless ``override=True``).

A layer binds its kernel once, when it is built (``kernel_for``): on the active platform's device type it gets
the function registered for that platform, elsewhere (a CPU tensor under the CUDA platform) none. Nothing
is looked up per step. The ops and their contracts are listed in ``KERNEL_OPS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


from brigade.plugins.errors import PluginLoadError
from brigade.plugins.registry import PluginSource, Registration, Registry

KERNEL_OPS: dict[str, str] = {
    "rms_norm": "RMSNorm: impl(layer, x, residual=None), the contract of RMSNorm.forward_native",
    "silu_and_mul": "SiluAndMul: impl(layer, x), the contract of SiluAndMul.forward_native",
    "rotary_embedding": "RotaryEmbedding: impl(layer, positions, query, key), as its forward_native",
    "dense_gemm": "unquantized linear: impl(x [T, K], weight [N, K], bias) -> [T, N], F.linear's contract",
    "silu_mul_gemm": "impl(x [T, 2K], weight, bias, *, residual=None) -> silu(gate) * up @ W.T + b (+ residual), "
                     "or None for a shape it does not take",
    "residual_gemm": "impl(x, weight, bias, residual) -> residual + x @ W.T + b, or None",
    "rms_norm_gemm": "impl(x, weight, bias, eps) -> (x / rms(x)) @ W.T + b, or None; registering it makes the "
                     "loader fold each RMSNorm's weight into the following projection",
    "fp8_gemm": "FP8 linear at decode sizes: impl(x [T, K], qweight [N, K] float8_e4m3fn, weight_scale [N] fp32, "
                "bias) -> x @ (qweight * weight_scale[:, None]).T + b in x's dtype, or None for a shape it does not "
                "take (the quantization method's own product then runs)",
    "fp8_silu_mul_gemm": "impl(x [T, 2K], qweight, weight_scale, bias, *, residual=None) -> silu(gate) * up @ W.T + b "
                         "(+ residual), W as in fp8_gemm, or None",
    "fp8_residual_gemm": "impl(x, qweight, weight_scale, bias, residual) -> residual + x @ W.T + b, W as in fp8_gemm, "
                         "or None",
    "fused_sampler": "impl(logits [B, V], temperature [B] or None, *, greedy) -> ids [B] int64 "
                     "(brigade.sample.fused)",
    "moe_topk_router": "TopKRouter: impl(layer, router_logits [T, E], counts [E] int64 or None, num_tokens 0-d or "
                       "None) -> (topk_weights [T, k] fp32, topk_ids [T, k] int64), the contract of its forward_native",
    "mla_decode": "LatentDecode: impl(layer, q_latent [D, H, L], q_pe [D, H, R], cache [N, B, L + R], block_table, "
                  "seq_lens, scale, max_seq_len) -> [D, H, L], the contract of its forward_native",
    "fused_moe": "FusedMoE: impl(layer, x [T, H], topk_weights [T, k] fp32, topk_ids [T, k]) -> [T, H], "
                 "the contract of FusedMoE.forward_native",
}
"""Every op a kernel can be registered for, with its function's contract."""

_SEP = "@"


def kernel_key(op: str, platform: str) -> str:
    """The registry name of ``op`` on ``platform``: ``"rms_norm@cuda"``."""
    return f"{op}{_SEP}{platform}"


def check_kernel(op: str, platform: str) -> None:
    """Raise ValueError for an op the core does not know or an empty platform name."""
    if op not in KERNEL_OPS:
        raise ValueError(f"unknown kernel op {op!r}; the core's ops are {', '.join(KERNEL_OPS)}")
    if not isinstance(platform, str) or not platform or _SEP in platform:
        raise ValueError(f"kernel {op!r}: platform must be a platform name such as 'cuda', got {platform!r}")


def kernel_label(impl: Any) -> str:
    """A kernel's default label: the attribute of a lazy path, else the function's qualified name."""
    if isinstance(impl, str):
        return impl.rpartition(":")[2]
    return getattr(impl, "__qualname__", type(impl).__name__)


def add_kernel(registry: Registry, op: str, platform: str, impl: Any, source: PluginSource, *,
               name: str | None = None, override: bool = False) -> None:
    """Store one kernel in ``registry`` (the manager's staged commit and tests use it).

    Raises ValueError (unknown op, bad platform) or DuplicateNameError, as ``Registry.add``.
    """
    check_kernel(op, platform)
    registry.add(kernel_key(op, platform), impl, source, override=override, op=op, platform=platform,
                 label=name or kernel_label(impl))


def _active_platform() -> tuple[str, str] | None:
    """(name, device type) of this process's platform, or None when none can be resolved."""
    from brigade.plugins import current_platform

    try:
        platform = current_platform()
    except PluginLoadError:
        return None
    return platform.name, platform.device_type


def kernel_for(op: str, device_type: str | None = None, *, registry: Registry | None = None
               ) -> Callable[..., Any] | None:
    """The function serving ``op`` for layers built on ``device_type`` (default: ``torch.get_default_device()``'s
    type), or None (the portable path). Resolves the active platform on first use; call it at build time.

    Raises:
        PluginLoadError: the registered lazy path failed to import (the message names the plugin).
    """
    from brigade.plugins import registries

    registry = registries.kernels if registry is None else registry
    if not len(registry):
        return None
    import torch  # here, not at import: `brigade` parses its flags without torch

    device_type = device_type or torch.get_default_device().type
    active = _active_platform()
    if active is None or active[1] != device_type:
        return None
    key = kernel_key(op, active[0])
    return registry.get(key) if key in registry else None


def kernel_table(registry: Registry, platform: str | None = None) -> list[dict[str, str]]:
    """The registered kernels (only ``platform``'s when given) as rows for listings, sorted by op:
    ``{"op", "platform", "kernel", "plugin", "distribution"}``."""
    rows = []
    for entry in registry.entries():
        if platform is None or entry.extra["platform"] == platform:
            rows.append({"op": entry.extra["op"], "platform": entry.extra["platform"], "kernel": entry.extra["label"],
                         "plugin": entry.source.plugin, "distribution": entry.source.distribution})
    return sorted(rows, key=lambda r: (r["platform"], r["op"]))


@contextmanager
def registered_kernel(op: str, platform: str, impl: Any, *, registry: Registry | None = None,
                      source: PluginSource | None = None) -> Iterator[Registration]:
    """Register ``impl`` for the duration of a ``with`` block (tests, benchmarks' A/B runs), then restore what
    was there. Layers bind at construction, so build them inside the block."""
    from brigade.plugins import process_plugin_manager, registries

    registry = registries.kernels if registry is None else registry
    source = source or process_plugin_manager().core_source
    key = kernel_key(op, platform)
    previous = registry.entry(key) if key in registry else None
    add_kernel(registry, op, platform, impl, source, override=True)
    try:
        yield registry.entry(key)
    finally:
        registry.remove(key)
        if previous is not None:
            registry.add(key, previous.value, previous.source, override=True, **previous.extra)


@contextmanager
def kernels_removed(platform: str, *, registry: Registry | None = None) -> Iterator[None]:
    """Hide every kernel of ``platform`` for a ``with`` block (layers built inside take the portable path),
    then put them back: how a test builds the reference model next to the fast one."""
    from brigade.plugins import registries

    registry = registries.kernels if registry is None else registry
    hidden = [e for e in registry.entries() if e.extra.get("platform") == platform]
    for entry in hidden:
        registry.remove(entry.name)
    try:
        yield
    finally:
        for entry in hidden:
            registry.add(entry.name, entry.value, entry.source, override=True, **entry.extra)
