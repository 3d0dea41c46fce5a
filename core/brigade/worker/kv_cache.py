"""KVCacheTensors: the runner's paged KV tensors, sized and laid out from the model's KV cache specs.

The model reports one ``KVCacheSpec`` per attention layer this rank holds (``CausalLM.kv_cache_specs``); the engine
core groups the layers of every rank (``group_layers``) and sends a ``KVCacheConfig``. There are
``num_tensors`` KV tensors of ``num_blocks`` blocks, laid out as the attention backend asks
(``AttentionSpec.tensor_shape``: ``AttentionBackend.kv_cache_shape``, or a latent attention layer's own
``[num_blocks, block_size, latent]``), and layer ``groups[g].layer_ids[i]`` reads and writes tensor ``i`` (vLLM's
hybrid allocator: a block id belongs to one group at a time, so groups share tensors). Model code and kernels
still see one tensor per layer (``kv_caches[layer]``). KV connectors share blocks only between equal ``layout``s.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from brigade.attention.backend import AttentionBackend
from brigade.interfaces.kv_cache_spec import AttentionSpec, KVCacheConfig, KVCacheGroup
from brigade.kv_transfer import KVCacheLayout


@dataclass(frozen=True)
class KVCacheTensors:
    """This rank's KV cache: the specs of the layers it holds, on an attention backend.

    Raises (at construction):
        ValueError: the model has no attention layer on this rank, or a layer whose cache is not paged K/V.
    """

    attn_backend: type[AttentionBackend]
    specs: dict[int, AttentionSpec]  # layer index -> spec, the layers whose KV this rank holds
    dtype: torch.dtype  # the model's
    cache_dtype: torch.dtype | None = None  # what the cache stores (float8 e4m3 with --kv-cache-dtype fp8); None: dtype

    def __post_init__(self):
        if not self.specs:
            raise ValueError("the model has no attention layer with a KV cache on this rank")
        for layer, spec in self.specs.items():
            if not isinstance(spec, AttentionSpec):
                raise ValueError(f"layer {layer}: a {spec.kind} KV cache is not paged K/V; Brigade lays out paged "
                                 "K/V caches only")

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype of the cache tensors: ``cache_dtype``, else the model's."""
        return self.cache_dtype or self.dtype

    @property
    def block_size(self) -> int:
        return next(iter(self.specs.values())).block_size

    def shape(self, num_blocks: int, spec: AttentionSpec | None = None) -> tuple[int, ...]:
        """One layer's tensor shape for ``num_blocks`` blocks (``spec``: that layer's; default: any of this rank's)."""
        spec = spec or next(iter(self.specs.values()))
        return spec.tensor_shape(self.attn_backend, num_blocks)

    def tensor_ids(self, groups: tuple[KVCacheGroup, ...]) -> list[int]:
        """The KV tensors this rank allocates: index ``i`` where some group's ``i``-th layer is one of this rank's."""
        return sorted({i for group in groups for i, layer in enumerate(group.layer_ids) if layer in self.specs})

    def bytes_per_block(self, groups: tuple[KVCacheGroup, ...], cache_dtype: torch.dtype | None = None) -> int:
        """Bytes one block id takes on this rank: one page in each KV tensor it allocates (``groups`` share the
        tensors), in ``cache_dtype`` (default: the cache's own)."""
        elem = torch.empty((), dtype=cache_dtype or self.storage_dtype).element_size()
        return math.prod(self.shape(1)) * elem * len(self.tensor_ids(groups))

    def allocate(self, config: KVCacheConfig, device: torch.device) -> list[torch.Tensor]:
        """Every layer's KV tensor, indexed by layer: this rank's layers get views of the shared zeroed tensors
        (``num_blocks`` blocks each), a layer another pipeline stage holds an empty tensor, so layer ``i`` still
        reads entry ``i``."""
        dtype = self.storage_dtype
        tensors = {i: torch.zeros(self.shape(config.num_blocks), dtype=dtype, device=device)
                   for i in self.tensor_ids(config.groups)}
        num_layers = 1 + max(layer for group in config.groups for layer in group.layer_ids)
        kv_caches = [torch.empty(0, dtype=dtype, device=device) for _ in range(num_layers)]
        for layer, (_, i) in config.tensor_index().items():
            if layer in self.specs:
                shape = self.shape(config.num_blocks, self.specs[layer])
                kv_caches[layer] = tensors[i] if tensors[i].shape == shape else tensors[i].view(shape)
        return kv_caches

    def layout(self, model_config, num_layers: int) -> KVCacheLayout:
        """The layout of these KV blocks, for KV connectors: blocks are shared only between equal layouts.

        The model is named by its directory's real path (plus the quantization method, and the seed of dummy
        weights), the block dimension found by asking the attention backend for caches of 1 and 2 blocks;
        ``num_layers``: the model's layers with a KV cache (every stage's).
        """
        one, two = self.shape(1), self.shape(2)
        block_dim = next(i for i, (a, b) in enumerate(zip(one, two)) if a != b)
        model = os.path.realpath(model_config.model)
        if model_config.quantization:
            model += f"+{model_config.quantization}"
        if model_config.load_format == "dummy":
            model += f"+dummy(seed={model_config.seed})"
        dtype = str(self.storage_dtype).removeprefix("torch.")
        return KVCacheLayout(model=model, dtype=dtype, block_size=self.block_size,
                             num_layers=num_layers, block_shape=one[:block_dim] + one[block_dim + 1:],
                             block_dim=block_dim)


def layer_groups(config: KVCacheConfig) -> list[int] | None:
    """Per layer index, its KV cache group (0 for a layer without KV cache), when there are several groups; None
    with one group (every layer then reads ``AttentionContext.metadata``, and the step builds nothing more)."""
    if len(config.groups) == 1:
        return None
    index = config.tensor_index()
    return [index[layer][0] if layer in index else 0 for layer in range(1 + max(index))]
