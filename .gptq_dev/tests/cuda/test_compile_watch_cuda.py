"""A real Triton compile after start-up is logged by brigade_cuda.compile_watch, naming the kernel and the
pointer whose alignment changed. Skipped as a whole without CUDA (CI); run on the H200 with
``pytest tests/cuda``."""

import logging

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from brigade_cuda import compile_watch  # noqa: E402


@triton.jit
def _watched_copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def test_an_unaligned_pointer_after_start_up_is_reported(caplog):
    from triton import knobs

    before = knobs.runtime.jit_cache_hook
    try:
        watch = compile_watch.watch()
        earlier = len(watch.late)  # an engine built earlier in this process may have armed the same watch
        x = torch.arange(64, dtype=torch.float32, device="cuda")
        y = torch.empty_like(x)
        _watched_copy_kernel[(1,)](x, y, 63, BLOCK=64)  # start-up: aligned pointers
        compile_watch.mark_serving()
        with caplog.at_level(logging.WARNING, logger="brigade_cuda.compile_watch"):
            _watched_copy_kernel[(1,)](x, y, 63, BLOCK=64)  # the same variant: silent
            assert caplog.records == []
            _watched_copy_kernel[(1,)](x[1:], y[1:], 63, BLOCK=64)  # 4 bytes in: a new variant
        torch.cuda.synchronize()
        assert torch.equal(y[1:], x[1:])
        (record,) = caplog.records
        assert "_watched_copy_kernel while serving" in record.getMessage()
        assert "x_ptr" in record.getMessage() and "tt.divisibility=16" in record.getMessage()
        assert watch.late[earlier:] == ["_watched_copy_kernel"]
    finally:
        knobs.runtime.jit_cache_hook = before
        compile_watch._watch = None
