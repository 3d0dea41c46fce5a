"""Build and load Brigade's compiled CPU kernels (``csrc/cpu_attention.c``) with the system C compiler.

The source is compiled once per machine into ``$BRIGADE_CACHE_DIR/kernels`` (default
``~/.cache/brigade/kernels``) with ``-O3 -march=native -ffast-math -fopenmp`` and linked without fast-math.
The file name carries a hash of the source, the flags, the compiler's version and the CPU's feature flags,
so an edit, another compiler or another CPU builds anew. The shared object is written under a temporary
name and renamed into place, so processes building at the same time never load a half-written file. It is
loaded with ctypes after torch, so its OpenMP calls land in the libgomp torch already uses (one thread
pool, no oversubscription).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from brigade.cache_paths import cache_dir as brigade_cache_dir

SOURCE = Path(__file__).parent / "csrc" / "cpu_attention.c"
# Compiled with -ffast-math (vectorized expf) but linked without it: gcc < 13 links crtfastmath.o into a
# shared object built with -ffast-math, whose load-time constructor turns on flush-to-zero for the whole
# process and silently changes every float op of torch and numpy after it.
# Largest query-head group (heads per KV head), head size and block size the decode kernel takes: they size
# its per-program scratch arrays and are compiled in from here.
LIMITS = {"MAX_GROUP": 16, "MAX_HEAD": 256, "MAX_BLOCK": 128}
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11",
                 *(f"-D{name}={value}" for name, value in LIMITS.items())]
LINK_FLAGS = ["-shared", "-fopenmp"]
ABI_VERSION = 2


class KernelBuildError(RuntimeError):
    """The CPU kernels could not be compiled or loaded; the message says why in one line."""


def cache_dir() -> Path:
    """The folder compiled kernels go to: ``<Brigade cache root>/kernels`` (``brigade.cache_paths``)."""
    return brigade_cache_dir() / "kernels"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise KernelBuildError("no C compiler found (set CC, or install gcc)")
    return cc


@functools.cache
def load() -> ctypes.CDLL:
    """Compile (when not cached) and load the kernels. Raises KernelBuildError with the reason."""
    cc = _compiler()
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"C compiler {cc!r} does not run: {e}") from None
    source = SOURCE.read_bytes()
    flags = " ".join(COMPILE_FLAGS + ["|"] + LINK_FLAGS)
    key = hashlib.sha256(b"\0".join([source, flags.encode(), version.encode(), _cpu_flags().encode(),
                                      platform.machine().encode()])).hexdigest()[:16]
    out_dir = cache_dir()
    target = out_dir / f"cpu_attention-{key}.so"
    if not target.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
        os.close(fd)
        obj = tmp[:-3] + ".o"
        try:
            for cmd in ([cc, *COMPILE_FLAGS, "-c", str(SOURCE), "-o", obj], [cc, *LINK_FLAGS, obj, "-o", tmp, "-lm"]):
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
                    raise KernelBuildError(f"{cc} failed on {SOURCE.name}: {lines[-1] if lines else proc.returncode}")
            os.replace(tmp, target)
        finally:
            for path in (tmp, obj):
                if os.path.exists(path):
                    os.unlink(path)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelBuildError(f"cannot load {target}: {e}") from None
    if lib.brigade_kernels_abi_version() != ABI_VERSION:
        raise KernelBuildError(f"{target} has ABI {lib.brigade_kernels_abi_version()}, expected {ABI_VERSION}")
    for name in ("brigade_decode_attention_f32", "brigade_decode_attention_bf16"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = ([ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float]
                       + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float])
    return lib


_DECODE = {torch.float32: "brigade_decode_attention_f32", torch.bfloat16: "brigade_decode_attention_bf16"}
DECODE_DTYPES = tuple(_DECODE)


def decode_supports(num_heads: int, num_kv_heads: int, head_size: int, block_size: int) -> bool:
    """Whether the decode kernel's compiled-in LIMITS take this shape."""
    return (num_heads // num_kv_heads <= LIMITS["MAX_GROUP"] and head_size <= LIMITS["MAX_HEAD"]
            and block_size <= LIMITS["MAX_BLOCK"])


def decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float, num_kv_heads: int, *,
                     sliding_window: int | None = None, logits_soft_cap: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Paged decode attention with one query token per request, reading K/V in place.

    The variants follow ``brigade.attention.variants``; under a sliding window the blocks before the window
    are not read.

    Args:
        query: [R, H, D] float32 or bfloat16 on the CPU.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, D], same dtype, contiguous.
        block_table: [R, >= ceil(max(seq_lens) / block_size)] int32.
        seq_lens: [R] int32, tokens of context including this step's (each >= 1).
        scale: softmax scale (usually D ** -0.5).
        sliding_window: keys each query sees (its own included), or None for all.
        logits_soft_cap: ``c`` of ``c * tanh(s / c)`` on the scaled scores, or None.
        sinks: [H] sink logits (any float dtype; passed as float32), or None.

    Returns: [R, H, D] in query's dtype.

    Raises:
        KernelBuildError: when the kernels cannot be built (see ``load``).
        ValueError: on a dtype, layout or size the kernel does not handle.
    """
    if query.dtype not in _DECODE or kv_cache.dtype != query.dtype:
        raise ValueError(f"decode kernel takes float32/bfloat16 query and cache of one dtype, "
                         f"got {query.dtype} and {kv_cache.dtype}")
    if not kv_cache.is_contiguous():
        raise ValueError("decode kernel needs a contiguous KV cache")
    fn = getattr(load(), _DECODE[query.dtype])
    query = query.contiguous()
    block_table = block_table.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    num_reqs, num_heads, head_size = query.shape
    out = torch.empty_like(query)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    if sinks is not None:
        sinks = sinks.detach().to(torch.float32).contiguous()
    status = fn(out.data_ptr(), query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(),
                seq_lens.data_ptr(), num_reqs, num_heads, num_kv_heads, head_size, kv_cache.shape[2],
                block_table.stride(0), scale, None if sinks is None else sinks.data_ptr(),
                sliding_window or 0, logits_soft_cap or 0.0)
    if status:
        raise ValueError(f"decode kernel refuses group {num_heads // num_kv_heads}, head size {head_size} or "
                         f"block size {kv_cache.shape[2]} (limits {', '.join(map(str, LIMITS.values()))})")
    return out
