"""BlockPool: a producer's host staging pool of KV blocks, indexed by chained block key, with leases and LRU eviction.

The pool is one tensor ``[num_slots, num_layers, *block_shape]`` of the KV dtype, registered with the producer's
NIXL agent so consumers can READ slots straight out of it. ``reserve`` picks a slot for a new block (a free one,
else the least recently used one that no lease holds), the caller copies the block in, then ``publish`` makes it
visible to ``lookup``. A ``lookup`` leases the slots it returns for ``lease_s`` seconds so they are not evicted
(overwritten) before the consumer has read them; ``release`` ends a lease early.

The index is touched by two threads (the worker saving blocks, the side channel answering consumers), so every
method takes the pool's lock; the tensor itself is only written between ``reserve`` and ``publish``, while the
slot is in no index and so unreachable to consumers.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

import torch

from brigade.kv_transfer import KVCacheLayout


@dataclass(slots=True)
class Lease:
    """Slots a consumer may read until ``expires`` (``time.monotonic()`` seconds)."""

    slot_ids: tuple[int, ...]
    expires: float


class BlockPool:
    """``num_slots`` KV blocks of ``layout`` in host memory.

    Invariant: a slot is in exactly one of: free, reserved (being written), indexed (``_index``: key -> slot, least
    recently used first). An indexed slot holds the KV of its key's block and is only evicted while no unexpired
    lease names it.

    Args:
        layout: the producer's KV cache layout (dtype and per-block shape).
        num_slots: blocks the pool holds (> 0).
        lease_s: how long a lookup's lease lasts, seconds.
    """

    def __init__(self, layout: KVCacheLayout, num_slots: int, lease_s: float):
        self.tensor = torch.zeros((num_slots, layout.num_layers, *layout.block_shape),
                                  dtype=getattr(torch, layout.dtype))  # [num_slots, num_layers, *block_shape]
        self.num_slots = num_slots
        self.lease_s = lease_s
        self.slot_bytes = self.tensor[0].numel() * self.tensor.element_size()
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._leases: dict[int, Lease] = {}
        self._num_leases = Counter()  # slot -> unexpired leases naming it
        self._lease_ids = itertools.count(1)

    @property
    def base_address(self) -> int:
        """Address of slot 0 in host memory; slot ``i`` starts ``i * slot_bytes`` after it."""
        return self.tensor.data_ptr()

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    # ---- the producer's worker ------------------------------------------------------------------
    def reserve(self, key: str) -> int | None:
        """A slot to write ``key``'s block into, then ``publish``; None when ``key`` is already indexed or every
        slot is leased or reserved (the block is then not saved)."""
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
                return None
            if self._free:
                return self._free.pop()
            self._expire_leases(time.monotonic())
            for old_key, slot in self._index.items():  # least recently used first
                if not self._num_leases[slot]:
                    del self._index[old_key]
                    return slot
            return None

    def publish(self, key: str, slot_id: int) -> None:
        """``slot_id`` (from ``reserve``) now holds ``key``'s block: make it visible to ``lookup``."""
        with self._lock:
            self._index[key] = slot_id

    # ---- the side channel -----------------------------------------------------------------------
    def lookup(self, keys: list[str]) -> tuple[int, list[int]]:
        """The slots of the longest leading run of ``keys`` that is indexed, leased for ``lease_s`` seconds.

        Returns:
            (lease id, slot ids); (0, []) when the first key is absent (no lease is made).
        """
        with self._lock:
            now = time.monotonic()
            self._expire_leases(now)
            slot_ids = []
            for key in keys:
                slot = self._index.get(key)
                if slot is None:
                    break
                self._index.move_to_end(key)
                slot_ids.append(slot)
            if not slot_ids:
                return 0, []
            lease_id = next(self._lease_ids)
            self._leases[lease_id] = Lease(tuple(slot_ids), now + self.lease_s)
            self._num_leases.update(slot_ids)
            return lease_id, slot_ids

    def release(self, lease_ids: list[int]) -> None:
        """End these leases (unknown or expired ids are ignored)."""
        with self._lock:
            for lease_id in lease_ids:
                self._drop_lease(lease_id)

    def num_leases(self) -> int:
        """Unexpired leases (for tests and logs)."""
        with self._lock:
            self._expire_leases(time.monotonic())
            return len(self._leases)

    def _expire_leases(self, now: float) -> None:
        for lease_id in [i for i, lease in self._leases.items() if lease.expires <= now]:
            self._drop_lease(lease_id)

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            self._num_leases.subtract(lease.slot_ids)
