"""Which Triton kernel variants a process compiles, and when: put this folder on PYTHONPATH and every Python
process prints one line to stderr per Triton kernel variant it loads or compiles (an in-memory cache miss), with
a wall-clock timestamp, the kernel's specialization and the seconds it took. A line timestamped after the server
was ready names a variant that stalled running requests. (brigade-cuda's own ``compile_watch`` logs only the
compiles that happen while serving; this one logs every compile, start-up included.)

Usage (GPU machine, from the repository root)::

    PYTHONPATH=benchmarks/compile_watch:$PYTHONPATH brigade serve ... 2> compiles.txt
"""
import sys
import time

try:
    from triton import knobs
except Exception:  # no Triton (or an old one): nothing to watch
    knobs = None

if knobs is not None:
    _pending: dict[str, float] = {}

    def _before(*, key, repr, **_):
        _pending[str(key)] = time.time()
        return False  # never skip the compile

    def _after(*, key, repr, compile=None, **_):
        start = _pending.pop(str(key), time.time())
        attrs = " ".join(str((compile or {}).get("configs", "")).split())[:600]
        name = repr.split("[", 1)[0]
        print(f"TRITON_COMPILE t={start:.3f} took={time.time() - start:.3f}s {name} attrs={attrs}", file=sys.stderr,
              flush=True)

    knobs.runtime.jit_cache_hook = _before
    knobs.runtime.jit_post_compile_hook = _after
