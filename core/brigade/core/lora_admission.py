"""LoRAAdmission: the ``--max-loras`` rule for admitting waiting requests, as vLLM v1's scheduler applies it."""

from __future__ import annotations

from collections.abc import Iterable

from brigade.core.request import Request


class LoRAAdmission:
    """Decides whether a waiting request's adapter may join the batch being built.

    The scheduler knows only each request's adapter, ``Request.lora_key`` (name and id); the runner holds
    ``max_loras`` adapter slots, so a step may run at most that many distinct adapters. Contract, per step:
    ``start_step(running)`` with the requests already running, then, for each waiting request in queue order,
    ``may_admit(request)``; after one joins, ``admitted(request)``. A request refused here is set aside for
    this step (the requests behind it may go). Without a limit (``max_loras`` None) every request may go.

    Owns only the set of adapter keys of the batch being built; never changes a request.
    """

    def __init__(self, max_loras: int | None):
        self.max_loras = max_loras  # None: LoRA is off, no limit
        self.enabled = max_loras is not None
        self._active: set[tuple[str, int | None]] = set()  # lora_key of every adapter in the batch being built

    def start_step(self, running: Iterable[Request]) -> None:
        """Begin admission for a step whose batch already holds ``running``."""
        if self.enabled:
            self._active = {r.lora_key for r in running if r.lora_key is not None}

    def may_admit(self, request: Request) -> bool:
        """False when admitting ``request`` would put more than ``max_loras`` distinct adapters in the batch."""
        key = request.lora_key
        return key is None or not self.enabled or key in self._active or len(self._active) < self.max_loras

    def admitted(self, request: Request) -> None:
        """``request`` joined the batch: its adapter now holds a slot for the rest of the step."""
        if self.enabled and request.lora_key is not None:
            self._active.add(request.lora_key)

    @staticmethod
    def ids_in_use(requests: Iterable[Request]) -> set[int]:
        """The ``lora_int_id`` of every adapter one of ``requests`` runs on."""
        return {r.lora_int_id for r in requests if r.lora_int_id is not None}

    @staticmethod
    def adapter_counts(requests: Iterable[Request]) -> dict[str, int]:
        """Adapter name -> how many of ``requests`` run on it (vLLM's ``lora_requests_info`` labels)."""
        counts: dict[str, int] = {}
        for request in requests:
            if request.lora_name is not None:
                counts[request.lora_name] = counts.get(request.lora_name, 0) + 1
        return counts
