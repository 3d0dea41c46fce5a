"""The packed host-to-device copy places every array at an aligned offset, whatever the step's sizes (Triton
specializes kernels on pointer alignment, so unaligned views compiled new variants mid-serving)."""

import pytest

from brigade.worker.input_batch import packed_offsets


@pytest.mark.parametrize("sizes", [[1, 1, 1], [3, 5, 7, 0, 2], [17, 16, 1], [8, 8]])
def test_packed_offsets_are_aligned_and_disjoint(sizes):
    offsets, total = packed_offsets(sizes, 8)
    assert all(o % 8 == 0 for o in offsets)
    ends = [o + s for o, s in zip(offsets, sizes)]
    assert all(end <= nxt for end, nxt in zip(ends, offsets[1:]))  # no overlap, order kept
    assert total == ends[-1] and offsets[0] == 0
    assert all(nxt - end < 8 for end, nxt in zip(ends, offsets[1:]))  # no more padding than needed
