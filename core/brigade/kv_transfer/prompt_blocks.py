"""Scheduler-role bookkeeping shared by connectors that save whole prompt blocks.

A producer connector saves the KV of a request's full prompt blocks once its prompt is computed. To know which
blocks, the scheduler-role instance tracks each producer request's block table as the scheduler grows it, and the
chained keys of its blocks (``extend_block_keys``). ``PromptBlocks`` does that bookkeeping; the connector decides
where the blocks go (files, a NIXL pool) and what a load looks like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from brigade.kv_transfer.base import KVCacheLayout
from brigade.kv_transfer.keys import extend_block_keys

if TYPE_CHECKING:
    from brigade.interfaces import ConnectorRequest, SchedulerOutput


@dataclass(slots=True)
class _Unsaved:
    """A producer's running request whose prompt blocks are not saved yet, and its block table so far."""

    request: ConnectorRequest
    block_ids: list[int]


class PromptBlocks:
    """Block keys per request, and which prompt blocks a producer saves at which step.

    Args:
        layout: the engine's KV cache layout (block size; seeds the keys).
    """

    def __init__(self, layout: KVCacheLayout):
        self.layout = layout
        self.block_size = layout.block_size
        self._keys: dict[str, list[str]] = {}  # request id -> keys of its full blocks so far
        self._unsaved: dict[str, _Unsaved] = {}

    def keys(self, request: ConnectorRequest) -> list[str]:
        """The keys of ``request``'s full blocks so far (hex sha256 strings, one per block, extended in place as
        the request grows; see ``extend_block_keys``)."""
        keys = self._keys.setdefault(request.request_id, [])
        extend_block_keys(keys, request.all_token_ids, self.layout, request.cache_salt)
        return keys

    def track(self, request: ConnectorRequest, block_ids: list[int]) -> None:
        """A producer's request was admitted with the block table ``block_ids``: save its prompt blocks once its
        prompt is computed (requests on a LoRA adapter are skipped: the keys do not name adapter weights)."""
        if request.lora_name is None:
            self._unsaved[request.request_id] = _Unsaved(request, list(block_ids))

    def completed(self, scheduler_output: SchedulerOutput) -> list[tuple[int, str]]:
        """``(block_id, key)`` of every full prompt block of the tracked requests whose prompt is computed by the
        end of this step (each request once); grows the tracked block tables by the step's new blocks first."""
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids):
            state = self._unsaved.get(req_id)
            if state is not None:
                state.block_ids.extend(new_block_ids[0])  # connectors serve single-group models only
        saves: list[tuple[int, str]] = []
        for req_id in scheduler_output.num_scheduled_tokens:
            state = self._unsaved.get(req_id)
            if state is None or state.request.num_computed_tokens < state.request.num_prompt_tokens:
                continue  # not a producer's request, or its prompt is not computed by the end of this step
            del self._unsaved[req_id]
            keys = self.keys(state.request)
            num_blocks = state.request.num_prompt_tokens // self.block_size
            saves += [(state.block_ids[i], keys[i]) for i in range(num_blocks)]
        return saves

    def forget(self, request_id: str) -> None:
        """The request finished: drop what is kept for it."""
        self._keys.pop(request_id, None)
        self._unsaved.pop(request_id, None)
