"""How long one full garbage collection takes in a process holding an engine, before and after freezing the
start-up heap (docs/benchmarks.md, "Garbage-collection pauses").

Run: ``.venv/bin/python benchmarks/cpu/gc_pause.py`` (after ``scripts/setup.sh``).
"""

import gc
import os
import time

from brigade import LLM


def full_collect_ms() -> float:
    start = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - start) * 1e3


if __name__ == "__main__":
    llm = LLM(os.path.expanduser("~/.cache/brigade/models/SmolLM2-135M-Instruct"))
    gc.unfreeze()  # the engine froze its heap at start-up: measure the heap as it would be without that
    print("objects", len(gc.get_objects()), "full collection ms", [round(full_collect_ms(), 1) for _ in range(3)])
    gc.freeze()
    print("frozen", gc.get_freeze_count(), "full collection ms", [round(full_collect_ms(), 1) for _ in range(3)])
