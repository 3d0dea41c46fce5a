"""Programmatic dependent launch (PDL) for the Triton kernels of a decode step (Hopper and newer).

A batch-1 decode step of an 8B model is ~350 small kernels back to back; without PDL each one starts only
after its predecessor has fully drained, so every boundary costs a launch latency and the predecessor's
tail. With PDL a kernel is launched with ``launch_pdl=True``; each of its programs first waits for the
previous kernel in the stream to finish and flush (``gdc_wait``) and then allows the next kernel to be
scheduled (``gdc_launch_dependents``), so the next kernel's launch and scheduling overlap this one's work.

Correctness rule, kept by every kernel that takes ``USE_PDL`` (through ``gdc_prologue``): ``gdc_wait`` comes
before any access to memory that a kernel of the same step may write, and every program executes it before it
ends. A kernel therefore never completes before its predecessor, so "predecessor complete" holds transitively
along the stream, and after its wait a kernel may read what any earlier kernel wrote. Memory that no kernel
of the step writes may be read before the wait (``pdl_prefetch``): weights and constant tables, the step's
inputs that copies staged before the graph, and the KV cache of earlier tokens. That is safe because kernel
i+1 can start only once kernel i has started, so every kernel of a graph starts after the work queued before
the graph has finished. The RMSNorm kernel reads its weight and the decode kernel (with its in-kernel rotary)
reads its block table and cached K/V that way, overlapping those loads with the previous kernel's tail.
(Requesting the skinny GEMM's first weight tile ahead of the wait was slower: the peeled first iteration
costs more than the hidden latency.) Kernels launched without PDL (cuBLAS, PyTorch ops) keep plain stream
order. CUDA graphs capture the launches as programmatic edges. PDL is used only while a CUDA graph is being
captured (the decode steps): eager launches with the PDL attribute were slower, and graphs are where the
per-kernel gaps add up (``docs/performance-notes.md`` has the timings). ``BRIGADE_CUDA_PDL=0`` turns it off (A/B timing).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from brigade_cuda import envs


@functools.cache
def pdl_enabled() -> bool:
    """True when the env allows it, Triton has the grid-dependency intrinsics and the GPU is sm_90+."""
    if not envs.BRIGADE_CUDA_PDL:
        return False
    try:
        from triton.language.extra import cuda as triton_cuda
    except ImportError:
        return False
    if not (hasattr(triton_cuda, "gdc_wait") and hasattr(triton_cuda, "gdc_launch_dependents")):
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


@functools.cache
def pdl_early() -> bool:
    """Trigger the next kernel's launch before waiting (``BRIGADE_CUDA_PDL_EARLY=1``), see ``gdc_prologue``."""
    return envs.BRIGADE_CUDA_PDL_EARLY


@functools.cache
def pdl_prefetch() -> bool:
    """Read step-invariant memory before ``gdc_wait`` where a kernel can (see the module docstring);
    ``BRIGADE_CUDA_PDL_PREFETCH=0`` keeps every load after the wait (A/B timing)."""
    return envs.BRIGADE_CUDA_PDL_PREFETCH


@triton.jit
def gdc_prologue(EARLY: tl.constexpr):
    """First statement of a kernel launched with PDL: wait for the previous kernel (always before any global
    memory access) and allow the next one to launch. ``EARLY`` allows it before the wait, so a chain of small
    kernels can have its successors resident and waiting while an earlier kernel still runs; the wait still
    comes first among memory accesses, so "predecessor complete" stays transitive."""
    if EARLY:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    else:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch() -> dict:
    """Keyword arguments for a kernel launch: ``USE_PDL`` and ``PDL_EARLY`` (the kernel's constexprs) and,
    when on, ``launch_pdl``.

    On only while the current stream is capturing a CUDA graph and ``pdl_enabled()``.
    """
    if pdl_enabled() and torch.cuda.is_current_stream_capturing():
        return {"USE_PDL": True, "PDL_EARLY": pdl_early(), "launch_pdl": True}
    return {"USE_PDL": False}
