"""CheckpointTensor: a lazy safetensors tensor that a tensor-parallel loader narrows before reading."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from brigade.model_executor.weight_utils import CheckpointTensor, materialize, safetensors_weights_iterator


def test_narrowed_reads_equal_the_tensor_slices(tmp_path):
    full = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    save_file({"w": full, "b": torch.arange(6.0)}, str(tmp_path / "model.safetensors"))
    lazy = dict(safetensors_weights_iterator(str(tmp_path), lazy=True))
    w = lazy["w"]
    assert isinstance(w, CheckpointTensor) and w.shape == (6, 8)
    rows = w.narrow(0, 2, 3)  # nothing is read until materialize
    assert rows.shape == (3, 8)
    assert torch.equal(materialize(rows), full[2:5])
    assert torch.equal(materialize(rows.narrow(1, 4, 4)), full[2:5, 4:8])  # narrows compose
    assert torch.equal(materialize(lazy["b"].narrow(0, 3, 3)), torch.arange(3.0, 6.0))
    with pytest.raises(ValueError, match=r"cannot take \[2, 5\) of dimension 0 of size 3"):
        rows.narrow(0, 2, 3)
