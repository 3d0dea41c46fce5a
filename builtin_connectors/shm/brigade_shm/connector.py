"""SharedMemoryConnector: prefill/decode disaggregation between Brigade instances on one host.

The producer (``kv_producer``), once a request's prompt is computed, saves the KV of its full prompt blocks to a
``KVBlockStore`` (files under ``kv_connector_extra_config["path"]``, by default ``/dev/shm/brigade-kv``). The
consumer (``kv_consumer``), for each new request, finds the longest run of stored blocks after its local
prefix-cache hit (whole blocks, capped at ``num_tokens - 1`` tokens so the step has logits), gets blocks for
them from the scheduler, loads them before the forward pass and computes only the rest. ``kv_both`` does both.

Loads and saves are synchronous, inside the step. A stored block that turns out unusable (truncated, corrupt, of
another layout) is a WARNING naming its file; the file is removed and the request computes those tokens in the
same step (``wait_for_load``), so outputs never change. Requests on a LoRA adapter are neither saved nor loaded
(the store's keys do not name adapter weights).

Anyone who can write to the store's directory can change what a consumer computes: keep it private to the user
that runs both instances (it is created with mode 0700).
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from brigade.config import ConfigError, KVTransferConfig
from brigade.interfaces import KVConnectorMetadata
from brigade.kv_transfer import KVCacheLayout, KVConnectorBase, KVConnectorRole, PromptBlocks
from brigade_shm.store import KVBlockStore, StoreEntryError

if TYPE_CHECKING:
    from brigade.interfaces import ConnectorRequest, SchedulerOutput

logger = logging.getLogger(__name__)

EXTRA_KEYS = ("path",)


def default_path() -> str:
    """/dev/shm/brigade-kv where /dev/shm exists (RAM-backed on Linux), else brigade-kv in the temp directory."""
    return os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir(), "brigade-kv")


@dataclass(slots=True)
class BlockTransfer:
    """One block to move: its id in this engine's KV cache and its key in the store."""

    block_id: int
    key: str


@dataclass(slots=True)
class RequestLoad:
    """The blocks a consumer loads for one request: they hold its tokens from ``num_computed_tokens`` on."""

    req_id: str
    num_computed_tokens: int  # the local prefix-cache hit, where the loaded range begins
    blocks: list[BlockTransfer]


@dataclass(slots=True)
class SharedMemoryConnectorMetadata(KVConnectorMetadata):
    """One step's work for the worker-role connector."""

    loads: list[RequestLoad] = field(default_factory=list)  # before the forward pass
    saves: list[BlockTransfer] = field(default_factory=list)  # after it


class SharedMemoryConnector(KVConnectorBase):
    """KV blocks through files in a shared directory. See the module docstring for the protocol.

    Counters (since start, for tests and logs): scheduler role ``num_matched_tokens`` (tokens the consumer was
    given instead of computing them); worker role ``num_loaded_tokens``, ``num_failed_loads`` (requests whose load
    fell back to computing) and ``num_saved_blocks``.
    """

    name = "SharedMemoryConnector"

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, layout: KVCacheLayout):
        super().__init__(config, role, layout)
        self.check_config(config)
        self.path = config.kv_connector_extra_config.get("path") or default_path()
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        self.store = KVBlockStore(self.path, layout)
        self.block_size = layout.block_size
        # scheduler role
        self._blocks = PromptBlocks(layout)  # block keys (the store's file names), and the prompt blocks to save
        self._pending_loads: list[RequestLoad] = []  # admitted since the last build_connector_meta
        self.num_matched_tokens = 0
        # worker role
        self._failed_loads: dict[str, int] = {}
        self.num_loaded_tokens = 0
        self.num_failed_loads = 0
        self.num_saved_blocks = 0

    @classmethod
    def check_config(cls, config: KVTransferConfig) -> None:
        """``kv_connector_extra_config`` may hold ``path``: a directory, or a path whose parent is one (it is then
        created); it must be writable by a producer.

        Raises:
            ConfigError: an unknown key, or a path that is not (or cannot become) a usable directory.
        """
        extra = config.kv_connector_extra_config
        flag = "--kv-transfer-config kv_connector_extra_config"
        unknown = sorted(set(extra) - set(EXTRA_KEYS))
        if unknown:
            raise ConfigError(f"{flag} has unknown keys {unknown} for {cls.name}; allowed: {', '.join(EXTRA_KEYS)}")
        path = extra.get("path", default_path())
        if not isinstance(path, str) or not path:
            raise ConfigError(f"{flag} path must be a directory path (a non-empty string), got {path!r}")
        if os.path.exists(path):
            if not os.path.isdir(path):
                raise ConfigError(f"{flag} path {path!r} is not a directory")
            if config.kv_role != "kv_consumer" and not os.access(path, os.W_OK | os.X_OK):
                raise ConfigError(f"{flag} path {path!r} is not writable, and {config.kv_role} saves KV there")
        elif not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise ConfigError(f"{flag} path {path!r} does not exist and neither does its parent directory")

    # ---- scheduler role -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: ConnectorRequest, num_computed_tokens: int) -> int:
        if not self.is_consumer or request.lora_name is not None:
            return 0
        first = num_computed_tokens // self.block_size
        last = (request.num_tokens - 1) // self.block_size  # at most num_tokens - 1 tokens: logits must exist
        keys = self._blocks.keys(request)
        num_blocks = first
        while num_blocks < last and self.store.contains(keys[num_blocks]):
            num_blocks += 1
        return (num_blocks - first) * self.block_size

    def update_state_after_alloc(self, request: ConnectorRequest, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            first = request.num_computed_tokens // self.block_size
            keys = self._blocks.keys(request)
            span = range(first, first + num_external_tokens // self.block_size)
            self._pending_loads.append(RequestLoad(request.request_id, request.num_computed_tokens,
                                                   [BlockTransfer(block_ids[i], keys[i]) for i in span]))
            self.num_matched_tokens += num_external_tokens
        if self.is_producer:
            self._blocks.track(request, block_ids)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> SharedMemoryConnectorMetadata:
        metadata = SharedMemoryConnectorMetadata(loads=self._pending_loads)
        self._pending_loads = []
        metadata.saves = [BlockTransfer(block_id, key) for block_id, key in self._blocks.completed(scheduler_output)]
        return metadata

    def request_finished(self, request: ConnectorRequest, block_ids: list[int]) -> bool:
        self._blocks.forget(request.request_id)
        return False  # saves are done within their step

    # ---- worker role ----------------------------------------------------------------------------
    def start_load_kv(self, metadata: SharedMemoryConnectorMetadata, kv_caches: list[torch.Tensor]) -> None:
        """Read and check every block of each request, then copy them into ``kv_caches``; a request with an
        unusable block loads nothing (``wait_for_load`` reports it)."""
        dim = self.layout.block_dim
        for load in metadata.loads:
            blocks = self._read_blocks(load)
            if blocks is None:
                self._failed_loads[load.req_id] = load.num_computed_tokens
                self.num_failed_loads += 1
                continue
            for transfer, kv in zip(load.blocks, blocks):  # kv: [num_layers, *block_shape]
                for layer, cache in enumerate(kv_caches):
                    cache.select(dim, transfer.block_id).copy_(kv[layer])
            self.num_loaded_tokens += len(load.blocks) * self.block_size

    def _read_blocks(self, load: RequestLoad) -> list[torch.Tensor] | None:
        blocks = []
        for transfer in load.blocks:
            try:
                blocks.append(self.store.read(transfer.key))
            except StoreEntryError as exc:
                logger.warning("KV store entry %s is unusable (%s); it is removed, and request %s computes its %d "
                               "tokens from token %d instead of loading them", self.store.path(transfer.key), exc,
                               load.req_id, len(load.blocks) * self.block_size, load.num_computed_tokens)
                self.store.discard(transfer.key)
                return None
        return blocks

    def wait_for_load(self) -> dict[str, int]:
        failed, self._failed_loads = self._failed_loads, {}
        return failed

    def save_kv(self, metadata: SharedMemoryConnectorMetadata, kv_caches: list[torch.Tensor]) -> None:
        """Copy each named block to the host ([num_layers, *block_shape]) and write it, skipping stored ones."""
        dim = self.layout.block_dim
        for transfer in metadata.saves:
            if self.store.contains(transfer.key):
                continue
            kv = torch.stack([cache.select(dim, transfer.block_id) for cache in kv_caches]).cpu()
            self.num_saved_blocks += self.store.write(transfer.key, kv)
