"""Weight utilities: parameter attributes, the default weight loader, checkpoint readers, dummy weights.

Parameters carry the metadata their loader needs as plain attributes set by ``set_weight_attrs``:

* ``weight_loader(param, loaded_weight, shard_id=None)``: how one checkpoint tensor lands in ``param``;
  merged layers use ``shard_id`` to pick the slice (``"q"``/``"k"``/``"v"`` or 0/1 for gate/up).
* ``shard_ids``: the shard ids a merged parameter expects, so a missing shard is detected.
* ``output_dim``: which dimension holds output features (0 for ``[out, in]`` weights; quantized
  methods may pack differently), ``None`` for per-shard scalars stored ``[num_shards]``.
* ``pack_factor``: how many logical output features share one stored element along ``output_dim``.
* ``input_dim``: which dimension follows the input features (1 for ``[out, in]`` weights; the packed rows of a
  GPTQ ``qweight``, the group rows of scales and zeros). A row-parallel layer under ``-tp`` splits such a
  parameter along it in ``tp`` equal parts; parameters without it are whole on every rank.
* ``required_in_checkpoint``: set False on parameters a quantization method derives itself in
  ``process_weights_after_loading``, so their absence from the checkpoint is not an error.
* ``full_shape``: under tensor parallelism, the shape of the whole (unsharded) parameter, of which this rank holds
  a slice; its ``weight_loader`` takes a tensor of the whole shape and keeps the rank's slice.

Under tensor parallelism the checkpoint reader yields ``CheckpointTensor``s instead of tensors: a lazy handle on
one safetensors tensor that a sharded layer narrows to its slice (``narrow_weight``) before any byte is read
(``materialize``), so no rank reads the whole model.
"""

from __future__ import annotations

import glob
import json
import os
import zlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def set_weight_attrs(param: torch.Tensor, attrs: dict[str, Any]) -> None:
    """Attach loader metadata to a parameter. Raises ValueError if an attribute is already set differently."""
    for key, value in attrs.items():
        if hasattr(param, key) and getattr(param, key) is not value:
            raise ValueError(f"parameter already has attribute {key!r}; refusing to overwrite it")
        setattr(param, key, value)


class CheckpointTensor:
    """One tensor of an open safetensors file, not read yet: ``narrow`` selects rows or columns, ``materialize``
    reads only the selected bytes (``safe_open(...).get_slice``)."""

    def __init__(self, part: Any, shape: tuple[int, ...], index: tuple[slice, ...] | None = None):
        self.part = part  # the file's slice handle for this tensor
        self.full_shape = tuple(shape)
        self.index = index or tuple(slice(0, n) for n in shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.index)

    def dim(self) -> int:
        return len(self.full_shape)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        """Rows (columns...) ``[start, start + length)`` of dimension ``dim`` of this selection; reads nothing.

        Raises:
            ValueError: the range leaves the selection.
        """
        dim = dim % len(self.index)
        current = self.index[dim]
        if start < 0 or start + length > current.stop - current.start:
            raise ValueError(f"cannot take [{start}, {start + length}) of dimension {dim} of size "
                             f"{current.stop - current.start}")
        index = list(self.index)
        index[dim] = slice(current.start + start, current.start + start + length)
        return CheckpointTensor(self.part, self.full_shape, tuple(index))

    def materialize(self) -> torch.Tensor:
        """Read the selected bytes into a new CPU tensor in the file's dtype."""
        if not self.full_shape:
            return self.part[:]
        return self.part[self.index]


def narrow_weight(weight: torch.Tensor | CheckpointTensor, dim: int, start: int,
                  length: int) -> torch.Tensor | CheckpointTensor:
    """``weight.narrow(dim, start, length)`` for a tensor or a ``CheckpointTensor`` (which stays unread)."""
    return weight.narrow(dim, start, length)


def materialize(weight: torch.Tensor | CheckpointTensor) -> torch.Tensor:
    """The tensor itself, or a ``CheckpointTensor``'s selected bytes read from its file."""
    return weight.materialize() if isinstance(weight, CheckpointTensor) else weight


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor | CheckpointTensor) -> None:
    """Copy a whole checkpoint tensor into ``param``, casting dtype and moving device.

    Raises:
        ValueError: the shapes differ (a 0-d tensor may fill a 1-element parameter).
    """
    loaded_weight = materialize(loaded_weight)
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.copy_(loaded_weight.reshape(param.shape))
        return
    if tuple(param.shape) != tuple(loaded_weight.shape):
        raise ValueError(f"checkpoint tensor of shape {tuple(loaded_weight.shape)} does not fit parameter "
                         f"of shape {tuple(param.shape)}")
    param.data.copy_(loaded_weight)


def safetensors_files(model_dir: str) -> list[str]:
    """The ``*.safetensors`` files that make up the checkpoint in ``model_dir``.

    When ``model.safetensors.index.json`` exists, only the files its ``weight_map`` names are used:
    some repositories (Mistral's) ship the same weights twice, as ``consolidated.safetensors`` and as
    sharded HF files, under different tensor names.

    Raises:
        FileNotFoundError: no safetensors file is there.
    """
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted({os.path.join(model_dir, name) for name in weight_map.values()})
    else:
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir!r}; use --load-format dummy for "
                                "random weights, or point --model at an HF-format directory")
    return files


def safetensors_weights_iterator(model_dir: str, *, lazy: bool = False
                                 ) -> Iterator[tuple[str, torch.Tensor | CheckpointTensor]]:
    """Yield ``(hf_name, tensor)`` for every tensor of the checkpoint, one at a time, on the CPU.

    Tensors are read lazily with ``safetensors.safe_open`` so at most one checkpoint tensor is
    materialized beyond the model itself. With ``lazy`` nothing is read here: each is a ``CheckpointTensor``
    that its parameter's loader narrows to the rank's slice and reads (tensor parallelism).

    Raises:
        ValueError: a file is not a readable safetensors file (truncated, corrupt); the message names it.
    """
    from safetensors import SafetensorError, safe_open  # a dependency of the core; imported lazily

    for path in safetensors_files(model_dir):
        try:
            f = safe_open(path, framework="pt", device="cpu")
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"cannot read the weights file {path!r} ({exc}); it may be truncated or corrupt: "
                             "copy or download it again") from exc
        with f:
            for name in f.keys():
                if lazy:
                    part = f.get_slice(name)
                    yield name, CheckpointTensor(part, tuple(part.get_shape()))
                    continue
                try:
                    tensor = f.get_tensor(name)
                except SafetensorError as exc:
                    raise ValueError(f"cannot read tensor {name!r} of the weights file {path!r} ({exc}); it may "
                                     "be truncated or corrupt: copy or download it again") from exc
                yield name, tensor


def initialize_dummy_weights(model: nn.Module, seed: int, *, std: float = 0.02) -> None:
    """Fill every parameter with random values for benchmarks that need a model's shape, not its weights.

    Floating-point parameters get N(0, std), std 0.02 being the usual initializer range of HF configs,
    which keeps activations finite through deep stacks; norm weights (any module whose class name ends
    in ``Norm``) are set to 1.0 and biases to 0. Integer parameters (packed quantized weights) are
    left as their quantization method created them.

    Each parameter draws from its own generator on its device, seeded with ``seed`` and the parameter's name,
    over its whole (unsharded) shape (``full_shape``); a tensor-parallel rank then keeps its slice through the
    parameter's ``weight_loader``. So the same seed gives the same weights on the same device type whatever the
    tensor-parallel layout.
    """
    norm_params = {id(p) for m in model.modules() if type(m).__name__.endswith("Norm")
                   for p in m.parameters(recurse=False)}
    for name, param in model.named_parameters():
        if not param.dtype.is_floating_point:
            continue
        if id(param) in norm_params:
            param.data.fill_(1.0)
            continue
        if name.endswith("bias"):
            param.data.zero_()
            continue
        gen = torch.Generator(device=param.device)
        gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63))
        full_shape = tuple(getattr(param, "full_shape", param.shape))
        native = param.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)
        if native and full_shape == tuple(param.shape):  # the whole parameter: draw in place
            param.data.normal_(0.0, std, generator=gen)
            continue
        if native:
            full = torch.empty(full_shape, dtype=param.dtype, device=param.device).normal_(0.0, std, generator=gen)
        else:
            # fp8 and other storage types have no normal_ kernel: sample in fp32 and cast.
            full = torch.empty(full_shape, device=param.device).normal_(0.0, std, generator=gen).to(param.dtype)
        if full_shape == tuple(param.shape):
            param.data.copy_(full)
        else:
            param.weight_loader(param, full)
