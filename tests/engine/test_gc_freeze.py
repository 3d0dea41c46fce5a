"""Start-up leaves a heap of long-lived objects that every full garbage collection would walk again (about
250 ms on this machine: a stall of every running request). The engine freezes it once started, and a full
collection afterwards skips it: the objects alive after start-up are in the permanent generation."""

from __future__ import annotations

import gc

from brigade import LLM, SamplingParams


def test_the_engine_freezes_its_start_up_heap(smollm2_path):
    gc.unfreeze()  # whatever an earlier test's engine froze
    assert gc.get_freeze_count() == 0
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=256)
    frozen = gc.get_freeze_count()
    assert frozen > 50_000  # modules, the model's and tokenizer's Python objects
    model = llm.engine.core.executor.worker.model_runner.model
    assert gc.is_tracked(model)
    assert not any(obj is model for obj in gc.get_objects())  # the collector's generations no longer hold it
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_a_frozen_heap_is_collected_at_exit_so_extensions_report_no_leaks():
    """Triton's nanobind bindings (imported by torch's meta-device ops, which the start-up checks of quantized
    models use) count their live objects at interpreter exit and print each one still alive as leaked; a frozen
    heap kept them alive. ``freeze_gc_heap`` unfreezes and collects at exit."""
    import subprocess
    import sys

    code = ("import torch\nfrom brigade.utils import freeze_gc_heap\n"
            "torch.empty(4, device='meta') / 2\nfreeze_gc_heap()\nfreeze_gc_heap()\nprint('done')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-2000:]
    assert "leaked" not in proc.stderr, proc.stderr[-2000:]


def test_a_stop_signal_during_the_exit_collection_prints_no_traceback():
    """``brigade serve`` stops its engine core with SIGTERM, whose handler raises ``SystemExit``; arriving while
    the exit hook collects the unfrozen heap, it printed "Exception ignored in atexit callback" and a traceback.
    The collection here raises as that handler would."""
    import subprocess
    import sys

    code = ("import gc\nfrom brigade.utils import freeze_gc_heap\nfreeze_gc_heap()\n"
            "def stop(*a):\n    raise SystemExit(0)\ngc.collect = stop\nprint('done')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-2000:]
