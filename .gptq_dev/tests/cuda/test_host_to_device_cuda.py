"""The packed host-to-device copy on a CUDA device: every view is aligned and holds its array, whatever the
step's sizes. Skipped as a whole without CUDA (CI); run on the H200 with ``pytest tests/cuda``."""

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from brigade.worker.input_batch import HostToDevice  # noqa: E402


@pytest.mark.parametrize("num_tokens,num_reqs", [(1, 1), (7, 3), (18, 2), (33, 5)])
def test_device_views_are_aligned_and_hold_the_arrays(num_tokens, num_reqs):
    rng = np.random.default_rng(num_tokens)
    arrays = {"input_ids": rng.integers(0, 1000, num_tokens), "positions": rng.integers(0, 100, num_tokens),
              "query_start_loc": rng.integers(0, 9, num_reqs + 1).astype(np.int32),
              "seq_lens": rng.integers(0, 9, num_reqs).astype(np.int32),
              "block_table": rng.integers(0, 9, (num_reqs, 3)).astype(np.int32)}
    out = HostToDevice(torch.device("cuda"))(arrays)
    for name, a in arrays.items():
        assert out[name].data_ptr() % HostToDevice.ALIGN_BYTES == 0, name
        assert np.array_equal(out[name].cpu().numpy(), a), name
