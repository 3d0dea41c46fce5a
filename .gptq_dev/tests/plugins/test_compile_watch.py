"""brigade_cuda.compile_watch: Triton kernel variants compiled after start-up are logged as a WARNING that
names the kernel and the arguments whose specialization changed (the hook itself, fed what Triton passes; a
real compile on the GPU is in tests/cuda/test_compile_watch_cuda.py)."""

import logging

from brigade_cuda import compile_watch
from brigade_cuda.compile_watch import CompileWatch, describe_variant


class _Fn:  # what Triton passes as ``fn`` (JitFunctionInfo): its ``name`` is read
    def __init__(self, name):
        self.name = name


def _compile(aligned: bool, block: int = 64) -> dict:
    """A variant as Triton 3.x passes it: signature by name, constants and attributes by argument path."""
    return {"signature": {"x_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"}, "constants": {(2,): block},
            "configs": [{(0,): [["tt.divisibility", 16]]} if aligned else {}]}


def test_describe_variant_names_each_argument():
    assert describe_variant(**{k: v for k, v in _compile(True).items() if k != "configs"},
                            attrs={(0,): [["tt.divisibility", 16]]}) == {
        "x_ptr": "*bf16 tt.divisibility=16", "n": "i32", "BLOCK": "constexpr=64"}


def test_only_compiles_after_start_up_warn_and_they_name_what_changed(caplog):
    watch = CompileWatch()
    with caplog.at_level(logging.WARNING, logger="brigade_cuda.compile_watch"):
        assert watch(fn=_Fn("_k"), compile=_compile(True), key="a") is None  # never skips the compile
        watch(fn=_Fn("_k"), compile=_compile(True, block=128), key="b")
        assert caplog.records == []  # start-up compiles are expected
        watch.serving = True
        watch(fn=_Fn("_k"), compile=_compile(False), key="c")
        watch(fn=_Fn("_other"), compile=_compile(True), key="d")
    first, second = (r.getMessage() for r in caplog.records)
    assert "new variant of _k while serving" in first
    assert "x_ptr: '*bf16 tt.divisibility=16' -> '*bf16'" in first and "BLOCK" not in first  # closest: block 64
    assert "_other" in second and "No variant of it was compiled at start-up" in second
    assert watch.late == ["_k", "_other"]


def test_a_previous_hook_is_called_and_may_skip_the_compile(caplog):
    calls = []

    def previous(**kwargs):
        calls.append(kwargs["key"])
        return kwargs["key"] == "skip"

    watch = CompileWatch(previous=previous)
    watch.serving = True
    with caplog.at_level(logging.WARNING, logger="brigade_cuda.compile_watch"):
        assert watch(fn=_Fn("_k"), compile=_compile(True), key="skip") is True
        assert watch.late == [] and caplog.records == []  # skipped: nothing compiled, nothing to warn about
        assert watch(fn=_Fn("_k"), compile=_compile(True), key="go") is False
    assert calls == ["skip", "go"] and watch.late == ["_k"]


def test_watch_installs_one_hook_and_each_start_up_silences_it():
    from triton import knobs

    before = knobs.runtime.jit_cache_hook
    try:
        first = compile_watch.watch()
        assert knobs.runtime.jit_cache_hook is first and first.previous is before
        compile_watch.mark_serving()
        assert first.serving
        assert compile_watch.watch() is first and not first.serving  # a second engine's start-up
    finally:
        knobs.runtime.jit_cache_hook = before
        compile_watch._watch = None
