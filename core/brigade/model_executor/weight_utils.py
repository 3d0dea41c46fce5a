"""Weight utilities: parameter attributes, the default weight loader, checkpoint readers, dummy weights.

Parameters carry the metadata their loader needs as plain attributes set by ``set_weight_attrs``:

* ``weight_loader(param, loaded_weight, shard_id=None)``: how one checkpoint tensor lands in ``param``;
  merged layers use ``shard_id`` to pick the slice (``"q"``/``"k"``/``"v"`` or 0/1 for gate/up).
* ``shard_ids``: the shard ids a merged parameter expects, so a missing shard is detected.
* ``output_dim``: which dimension holds output features (0 for ``[out, in]`` weights; quantized
  methods may pack differently), ``None`` for per-shard scalars stored ``[num_shards]``.
* ``pack_factor``: how many logical output features share one stored element along ``output_dim``.
* ``required_in_checkpoint``: set False on parameters a quantization method derives itself in
  ``process_weights_after_loading``, so their absence from the checkpoint is not an error.
"""

from __future__ import annotations

import glob
import json
import os
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


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copy a whole checkpoint tensor into ``param``, casting dtype and moving device.

    Raises:
        ValueError: the shapes differ (a 0-d tensor may fill a 1-element parameter).
    """
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


def safetensors_weights_iterator(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every tensor of the checkpoint, one at a time, on the CPU.

    Tensors are read lazily with ``safetensors.safe_open`` so at most one checkpoint tensor is
    materialized beyond the model itself.

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
    left as their quantization method created them. Sampling uses a generator on the parameters'
    device, seeded with ``seed``, so the same seed gives the same weights on the same device type.
    """
    norm_params = {id(p) for m in model.modules() if type(m).__name__.endswith("Norm")
                   for p in m.parameters(recurse=False)}
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if not param.dtype.is_floating_point:
            continue
        if id(param) in norm_params:
            param.data.fill_(1.0)
            continue
        if name.endswith("bias"):
            param.data.zero_()
            continue
        gen = generators.get(param.device)
        if gen is None:
            gen = torch.Generator(device=param.device)
            gen.manual_seed(seed)
            generators[param.device] = gen
        if param.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            param.data.normal_(0.0, std, generator=gen)
        else:
            # fp8 and other storage types have no normal_ kernel: sample in fp32 and cast.
            param.data.copy_(torch.empty(param.shape, device=param.device).normal_(0.0, std, generator=gen))
