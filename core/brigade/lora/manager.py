"""LoRAManager: the model runner's adapters and weight slots (after vLLM's LoRAModelManager).

The scheduler guarantees that a step holds at most ``max_loras`` distinct adapters; this class decides
*how* they run: which slot each one occupies (an adapter stays in its slot across steps, and the slot used
longest ago is reused for a newcomer), and the per-token slot mask the layers read. Adapters are loaded
and checked when registered (``add_adapter``), not when a request first uses them. Adapters are keyed by
``lora_int_id`` (unique per registration, see ``LoRARequest``), so an adapter unloaded while its last requests
finish and a new one loaded under the same name are two adapters here.

Three stores, as in vLLM's LRUCacheWorkerLoRAManager: the registry of every registered adapter (its
``LoRARequest``: name, id, folder; never capped), the host weights of at most ``--max-cpu-loras`` of them (an
LRU cache; an adapter evicted from it is read again from its folder when a step needs it), and the
``--max-loras`` device slots. A slot holds its own copy of the weights, so an adapter whose host copy was
evicted keeps running from its slot without a reload.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from brigade.config import LoRAConfig
from brigade.interfaces import LoRARequest
from brigade.lora.adapter import CONFIG_FILE, SUPPORTED_MODULES, WEIGHTS_FILE, LoRAAdapter, LoRAError, load_adapter
from brigade.lora.layers import LoRABatch, LoRALinear

logger = logging.getLogger(__name__)

_LAYER_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")
_HELD_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class LoRAManager:
    """Wraps a model's projections with LoRA slots, keeps the registered adapters and a bounded cache of their
    host weights.

    Invariants: ``host_weights`` holds at most ``max_cpu_loras`` entries, each of a registered adapter; every
    id in ``slots`` is registered, and its slot holds that adapter's weights whether or not its host copy is
    still cached.

    Args:
        model: the loaded model; its decoder projections (``layers.{i}.{self_attn|mlp}.{proj}``, merged ones
            expanded through the class's ``packed_modules_mapping``) get a ``LoRALinear`` as ``module.lora``. On a
            pipeline stage only its own layers are there, and an adapter's weights for the others are left to
            their stages; under tensor parallelism each slot holds the rank's slice (``LoRALinear``).
            The model's norm weights must not be folded into those projections (the loader skips folding
            when LoRA is enabled).
        hf_config: the model's config (adapters are checked against it).
        lora_config: ``max_loras`` slots, ``max_lora_rank`` per shard, ``max_cpu_loras`` host copies.
        max_num_tokens: the most tokens one forward pass may carry (rows of the mask).
    """

    def __init__(self, model: nn.Module, hf_config: Any, lora_config: LoRAConfig, *, max_num_tokens: int,
                 device: torch.device, dtype: torch.dtype):
        from brigade.model_executor.layers.linear import LinearBase

        self.hf_config = hf_config
        self.config = lora_config
        packed = getattr(type(model), "packed_modules_mapping", {})
        targets = []  # (layer index, HF names of the module's output shards, the module)
        # The decoder layers this model (this pipeline stage) holds: another stage's are empty stand-ins.
        self.held_layers = {int(m.group(1)) for name, _ in model.named_modules()
                            if (m := _HELD_LAYER.search(name)) is not None}
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
                                         dtype=dtype, device=device, **_tp_slices(module))
                self.layers.append((layer, shards, module.lora))
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            raise LoRAError(f"--max-loras {n} x --max-lora-rank {r}: the LoRA slots need {slot_bytes / 2**30:.1f} "
                            f"GiB on {device}, which could not be allocated ({type(exc).__name__}); lower "
                            "--max-loras or --max-lora-rank") from None
        self.registry: dict[int, LoRARequest] = {}  # every registered adapter: lora_int_id -> name, id, folder
        # lora_int_id -> host weights, least recently used first; at most max_cpu_loras of them
        self.host_weights: OrderedDict[int, LoRAAdapter] = OrderedDict()
        self.max_cpu_loras = lora_config.max_cpu_loras or lora_config.max_loras
        # lora_int_id -> (size, mtime_ns) of its two files when registered: a reload must read the same weights
        self._file_stamps: dict[int, tuple[tuple[int, int], ...]] = {}
        # Adapters whose evicted weights could not be read again: lora_int_id -> the LoRAError line. They stay
        # refused until removed (blocks of their failed requests are in the prefix cache under their id).
        self.failed: dict[int, str] = {}
        self.num_reloads = 0  # host copies read again from their folder after an eviction, since start
        self.slots: list[int | None] = [None] * lora_config.max_loras  # slot -> lora_int_id
        self._last_used = [0] * lora_config.max_loras  # step count when each slot last ran
        self._steps = 0
        self._mask_rows = 0  # rows of the mask that may be non-zero

    # ---- registry ---------------------------------------------------------------------------------
    def add_adapter(self, request: LoRARequest) -> bool:
        """Load and check ``request``'s adapter under ``request.lora_int_id``, register it and cache its host
        weights (evicting the least recently used host copy beyond ``max_cpu_loras``); False when that id is
        already registered (nothing is read then).

        Raises:
            LoRAError: the adapter cannot be served (see ``adapter.load_adapter``).
        """
        if request.lora_int_id in self.registry:
            return False
        stamps = _file_stamps(request.lora_path)
        adapter = self._load(request)
        self.registry[request.lora_int_id] = request
        self._file_stamps[request.lora_int_id] = stamps
        self._cache(request.lora_int_id, adapter, keep=())
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
        request = self.registry.pop(lora_int_id, None)
        if request is None:
            return False
        self.host_weights.pop(lora_int_id, None)
        self._file_stamps.pop(lora_int_id, None)
        self.failed.pop(lora_int_id, None)
        if lora_int_id in self.slots:
            slot = self.slots.index(lora_int_id)
            self.slots[slot] = None
            for _, _, lora in self.layers:
                lora.clear_slot(slot)
        logger.info("LoRA adapter %r (id %d) removed", request.lora_name, lora_int_id)
        return True

    def _load(self, request: LoRARequest) -> LoRAAdapter:
        """Read and check the adapter's folder, also against the projections this model adapts."""
        adapter = load_adapter(request.lora_name, request.lora_path, self.hf_config,
                               max_rank=self.config.max_lora_rank)
        covered = {(layer, shard) for layer, shards, _ in self.layers for shard in shards}
        # Under pipeline parallelism the other stages' layers are not here: their ranks take those weights.
        lacking = sorted(key for key in set(adapter.weights) - covered if key[0] in self.held_layers)
        if lacking:
            layer, module = lacking[0]
            raise LoRAError(f"LoRA adapter {adapter.name!r} ({adapter.path}): layer {layer} {module} cannot take a "
                            f"LoRA delta in this model (a quantized or missing projection)")
        return adapter

    # ---- host weights (an LRU cache of at most max_cpu_loras adapters) -------------------------------
    def _cache(self, lora_int_id: int, adapter: LoRAAdapter, *, keep: Collection[int]) -> None:
        """Cache an adapter's host weights as the most recently used, then evict the least recently used
        copies beyond ``max_cpu_loras``, never one in ``keep`` (the adapters the coming step needs)."""
        self.host_weights[lora_int_id] = adapter
        self.host_weights.move_to_end(lora_int_id)
        while len(self.host_weights) > self.max_cpu_loras:
            victim = next((n for n in self.host_weights if n not in keep and n != lora_int_id), None)
            if victim is None:  # more adapters in one step than host copies: set_batch refuses such a step
                raise RuntimeError(f"a step needs {len(keep)} LoRA adapters' host weights, above --max-cpu-loras "
                                   f"{self.max_cpu_loras}")
            evicted = self.host_weights.pop(victim)
            logger.debug("LoRA adapter %r (id %d): host weights evicted (--max-cpu-loras %d)%s", evicted.name,
                         victim, self.max_cpu_loras, "; its slot keeps its copy" if victim in self.slots else "")

    def _host_copy(self, lora_int_id: int, keep: Collection[int]) -> LoRAAdapter:
        """The adapter's host weights, read again from its folder when they were evicted (logged at INFO).

        Raises:
            LoRAError: the weights were evicted and cannot be read again (the folder changed or is gone); the
                adapter is refused from then on (``failed``), until it is removed.
            RuntimeError: the id was never registered.
        """
        if lora_int_id in self.failed:
            raise LoRAError(self.failed[lora_int_id])
        adapter = self.host_weights.get(lora_int_id)
        if adapter is not None:
            self.host_weights.move_to_end(lora_int_id)
            return adapter
        request = self.registry.get(lora_int_id)
        if request is None:
            raise RuntimeError(f"LoRA adapter id {lora_int_id} is not registered")
        logger.info("LoRA adapter %r (id %d): reading its weights again from %s (evicted from host memory, "
                    "--max-cpu-loras %d)", request.lora_name, lora_int_id, request.lora_path, self.max_cpu_loras)
        try:
            stamps = _file_stamps(request.lora_path)
            adapter = self._load(request)
            if stamps != self._file_stamps[lora_int_id]:
                raise LoRAError(f"LoRA adapter {request.lora_name!r} ({request.lora_path}): {CONFIG_FILE} or "
                                f"{WEIGHTS_FILE} changed since the adapter was loaded")
        except LoRAError as exc:
            message = (f"{exc}; its host weights had been evicted (--max-cpu-loras {self.max_cpu_loras}) and "
                       "cannot be read again: its requests are aborted until it is unloaded and loaded again")
            self.failed[lora_int_id] = message
            logger.error("%s", message)
            raise LoRAError(message) from None
        self.num_reloads += 1
        self._cache(lora_int_id, adapter, keep=keep)
        return adapter

    def maybe_reload(self, lora_ids: Iterable[int | None]) -> dict[int, str]:
        """Before a step: read again the host weights of its adapters that hold no slot and were evicted.

        Args:
            lora_ids: the adapters of the step's requests (None: the base model; repeats allowed).
        Returns:
            The adapters that cannot run, ``lora_int_id -> the LoRAError line``: their requests must be left
            out of the step (``set_batch`` raises LoRAError for them).
        """
        wanted = list(dict.fromkeys(n for n in lora_ids if n is not None))
        failed = {}
        for lora_id in wanted:
            if lora_id in self.slots:
                continue  # runs from its slot's copy: the host copy is not needed
            try:
                self._host_copy(lora_id, keep=wanted)
            except LoRAError as exc:
                failed[lora_id] = str(exc)
        return failed

    # ---- one step -----------------------------------------------------------------------------------
    def set_batch(self, lora_ids: Sequence[int | None], num_tokens: Sequence[int]) -> None:
        """Give the step's adapters slots and write the token mask for the step's rows.

        Args:
            lora_ids: each scheduled request's adapter, its ``lora_int_id`` (None: the base model), in batch order.
            num_tokens: each request's tokens this step, same order.
        Raises:
            LoRAError: an adapter whose host weights were evicted and cannot be read again (``maybe_reload``
                finds them first, so that the runner leaves their requests out).
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
        for lora_id in wanted:  # the step's adapters are the most recently used host copies
            if lora_id in self.host_weights:
                self.host_weights.move_to_end(lora_id)
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
        """Copy an adapter's weights into a slot (a free one, or the least recently used one the step does not
        need); from then on the slot's copy serves it, whatever happens to its host copy."""
        adapter = self._host_copy(lora_id, keep=in_step)
        free = [i for i, n in enumerate(self.slots) if n is None]
        if free:
            slot = free[0]
        else:  # the least recently used slot whose adapter this step does not need
            slot = min((i for i, n in enumerate(self.slots) if n not in in_step), key=self._last_used.__getitem__)
        for layer, shards, lora in self.layers:
            lora.set_slot(slot, [adapter.weights.get((layer, s)) for s in shards], adapter.scaling)
        self.slots[slot] = lora_id
        logger.debug("LoRA adapter %r (id %d) in slot %d", adapter.name, lora_id, slot)


def _tp_slices(module: nn.Module) -> dict[str, Any]:
    """Where ``module``'s part of the full projection starts under tensor parallelism (``LoRALinear``'s
    ``input_start`` and ``output_starts``): a row-parallel layer's first input feature, a column-parallel one's
    first row of each output shard (``shard_rank``: KV heads replicated over ranks share a slice)."""
    input_start = getattr(module, "input_start", 0)
    shard_rank = getattr(module, "shard_rank", None)
    if shard_rank is None:
        return {"input_start": input_start}
    return {"input_start": input_start,
            "output_starts": [shard_rank(j) * size for j, size in enumerate(module.output_sizes)]}


def _file_stamps(path: str) -> tuple[tuple[int, int], ...]:
    """(size, mtime_ns) of an adapter folder's two files ((-1, -1) for one that cannot be read): a reload
    compares them with those taken at registration, so that an id keeps meaning one set of weights."""
    stamps = []
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        try:
            st = os.stat(os.path.join(path, name))
            stamps.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append((-1, -1))
    return tuple(stamps)
