"""LoRAManager: the model runner's adapters and weight slots (book ch. 12: vLLM's LoRAModelManager).

The scheduler guarantees that a step holds at most ``max_loras`` distinct adapters; this class decides
*how* they run: which slot each one occupies (an adapter stays in its slot across steps, and the slot used
longest ago is reused for a newcomer), and the per-token slot mask the layers read. Adapters are loaded
and checked when registered (``add_adapter``), not when a request first uses them. Adapters are keyed by
``lora_int_id`` (unique per registration, see ``LoRARequest``), so an adapter unloaded while its last requests
finish and a new one loaded under the same name are two adapters here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from brigade.config import LoRAConfig
from brigade.lora.adapter import SUPPORTED_MODULES, LoRAAdapter, LoRAError, load_adapter
from brigade.lora.layers import LoRABatch, LoRALinear
from brigade.lora.request import LoRARequest

logger = logging.getLogger(__name__)

_LAYER_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


class LoRAManager:
    """Wraps a model's projections with LoRA slots and keeps the adapters' host weights.

    Args:
        model: the loaded model; its decoder projections (``layers.{i}.{self_attn|mlp}.{proj}``, merged ones
            expanded through the class's ``packed_modules_mapping``) get a ``LoRALinear`` as ``module.lora``.
            The model's norm weights must not be folded into those projections (the loader skips folding
            when LoRA is enabled).
        hf_config: the model's config (adapters are checked against it).
        lora_config: ``max_loras`` slots, ``max_lora_rank`` per shard.
        max_num_tokens: the most tokens one forward pass may carry (rows of the mask).
    """

    def __init__(self, model: nn.Module, hf_config: Any, lora_config: LoRAConfig, *, max_num_tokens: int,
                 device: torch.device, dtype: torch.dtype):
        from brigade.model_executor.layers.linear import LinearBase

        self.hf_config = hf_config
        self.config = lora_config
        packed = getattr(type(model), "packed_modules_mapping", {})
        targets = []  # (layer index, HF names of the module's output shards, the module)
        for name, module in model.named_modules():
            match = _LAYER_MODULE.search(name)
            if match is None or not isinstance(module, LinearBase):
                continue
            shards = packed.get(match.group(2), [match.group(2)])
            if not all(s in SUPPORTED_MODULES for s in shards) or len(shards) != len(module.output_sizes):
                continue
            targets.append((int(match.group(1)), shards, module))
        if not targets:
            raise LoRAError(f"--enable-lora: {type(model).__name__} has no projections LoRA can adapt")
        n, r = lora_config.max_loras, lora_config.max_lora_rank
        slot_bytes = sum(n * len(shards) * r * (m.input_size + m.output_size) for _, shards, m in targets) \
            * torch.empty((), dtype=dtype).element_size() + max_num_tokens * n * 4
        logger.info("LoRA: %d slots of rank %d on %d projections take %.2f GiB on %s", n, r, len(targets),
                    slot_bytes / 2**30, device)
        # (layer index, HF names of the module's output shards, its slots)
        self.layers: list[tuple[int, list[str], LoRALinear]] = []
        try:
            self.batch = LoRABatch(max_num_tokens, n, dtype=dtype, device=device)
            for layer, shards, module in targets:
                module.lora = LoRALinear(module.input_size, module.output_sizes, self.batch, max_rank=r,
                                         dtype=dtype, device=device)
                self.layers.append((layer, shards, module.lora))
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            raise LoRAError(f"--max-loras {n} x --max-lora-rank {r}: the LoRA slots need {slot_bytes / 2**30:.1f} "
                            f"GiB on {device}, which could not be allocated ({type(exc).__name__}); lower "
                            "--max-loras or --max-lora-rank") from None
        self.adapters: dict[int, LoRAAdapter] = {}  # lora_int_id -> host weights
        self.slots: list[int | None] = [None] * lora_config.max_loras  # slot -> lora_int_id
        self._last_used = [0] * lora_config.max_loras  # step count when each slot last ran
        self._steps = 0
        self._mask_rows = 0  # rows of the mask that may be non-zero

    # ---- registry ---------------------------------------------------------------------------------
    def add_adapter(self, request: LoRARequest) -> bool:
        """Load and check ``request``'s adapter under ``request.lora_int_id``; False when that id is already
        registered (nothing is read then).

        Raises:
            LoRAError: the adapter cannot be served (see ``adapter.load_adapter``).
        """
        if request.lora_int_id in self.adapters:
            return False
        adapter = load_adapter(request.lora_name, request.lora_path, self.hf_config,
                               max_rank=self.config.max_lora_rank)
        covered = {(layer, shard) for layer, shards, _ in self.layers for shard in shards}
        lacking = sorted(set(adapter.weights) - covered)
        if lacking:
            layer, module = lacking[0]
            raise LoRAError(f"LoRA adapter {adapter.name!r} ({adapter.path}): layer {layer} {module} cannot take a "
                            f"LoRA delta in this model (a quantized or missing projection)")
        self.adapters[request.lora_int_id] = adapter
        logger.info("LoRA adapter %r (id %d): rank %d, scaling %g, %d projections (%s) from %s", adapter.name,
                    request.lora_int_id, adapter.rank, adapter.scaling, len(adapter.weights),
                    ", ".join(sorted(adapter.target_modules)), adapter.path)
        return True

    def remove_adapter(self, lora_int_id: int) -> bool:
        """Forget an adapter and zero its slot; False when no adapter has that id.

        The caller makes sure no step still to be prepared needs it (the engine core waits for the adapter's
        requests to finish); a step already queued on the device is not disturbed, since the slot is zeroed
        after it in stream order.
        """
        adapter = self.adapters.pop(lora_int_id, None)
        if adapter is None:
            return False
        if lora_int_id in self.slots:
            slot = self.slots.index(lora_int_id)
            self.slots[slot] = None
            for _, _, lora in self.layers:
                lora.clear_slot(slot)
        logger.info("LoRA adapter %r (id %d) removed", adapter.name, lora_int_id)
        return True

    # ---- one step -----------------------------------------------------------------------------------
    def set_batch(self, lora_ids: Sequence[int | None], num_tokens: Sequence[int]) -> None:
        """Give the step's adapters slots and write the token mask for the step's rows.

        Args:
            lora_ids: each scheduled request's adapter, its ``lora_int_id`` (None: the base model), in batch order.
            num_tokens: each request's tokens this step, same order.
        Raises:
            RuntimeError: more distinct adapters than slots (the scheduler must not allow it), or an adapter
                that was never registered.
        """
        self._steps += 1
        wanted = list(dict.fromkeys(n for n in lora_ids if n is not None))
        if not wanted:
            self.clear_batch()
            return
        if len(wanted) > len(self.slots):
            raise RuntimeError(f"a step with {len(wanted)} LoRA adapters, above --max-loras {len(self.slots)}")
        for lora_id in wanted:
            if lora_id not in self.slots:
                self._activate(lora_id, wanted)
            self._last_used[self.slots.index(lora_id)] = self._steps
        slot_of = {lora_id: i for i, lora_id in enumerate(self.slots) if lora_id is not None}
        counts = np.asarray(num_tokens, dtype=np.int64)
        total = int(counts.sum())
        if total > self.batch.mask.shape[0]:
            raise RuntimeError(f"a step of {total} tokens exceeds the LoRA mask's {self.batch.mask.shape[0]} rows")
        slot_per_req = np.fromiter((-1 if n is None else slot_of[n] for n in lora_ids), dtype=np.int64,
                                   count=len(lora_ids))
        token_slots = np.repeat(slot_per_req, counts)
        host = np.zeros((total, len(self.slots)), dtype=np.float32)
        rows = np.nonzero(token_slots >= 0)[0]
        host[rows, token_slots[rows]] = 1.0
        mask = self.batch.mask
        if self._mask_rows > total:
            mask[total:self._mask_rows].zero_()
        mask[:total].copy_(torch.from_numpy(host))  # to the mask's dtype and device
        self._mask_rows = total

    def clear_batch(self) -> None:
        """No adapter for any row (base-model steps, dummy and profiling passes)."""
        if self._mask_rows:
            self.batch.mask[:self._mask_rows].zero_()
            self._mask_rows = 0

    def _activate(self, lora_id: int, in_step: list[int]) -> None:
        adapter = self.adapters.get(lora_id)
        if adapter is None:
            raise RuntimeError(f"LoRA adapter id {lora_id} is not registered")
        free = [i for i, n in enumerate(self.slots) if n is None]
        if free:
            slot = free[0]
        else:  # the least recently used slot whose adapter this step does not need
            slot = min((i for i, n in enumerate(self.slots) if n not in in_step), key=self._last_used.__getitem__)
        for layer, shards, lora in self.layers:
            lora.set_slot(slot, [adapter.weights.get((layer, s)) for s in shards], adapter.scaling)
        self.slots[slot] = lora_id
        logger.debug("LoRA adapter %r (id %d) in slot %d", adapter.name, lora_id, slot)
