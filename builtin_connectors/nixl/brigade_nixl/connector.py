"""NixlConnector: prefill/decode disaggregation between Brigade instances through NIXL READs.

The producer (``kv_producer``), once a request's prompt is computed, copies the KV of its full prompt blocks into
a host staging pool (``BlockPool``) registered with its NIXL agent, and answers consumers on a side channel
(``SideChannelServer``, ZeroMQ on ``host:port``). The consumer (``kv_consumer``), for each new request, asks the
producer which blocks after its local prefix-cache hit the pool holds (whole blocks, capped at ``num_tokens - 1``
tokens so the step has logits; the producer leases those slots), gets blocks for them from the scheduler, READs
them with NIXL into a staging tensor before the forward pass, copies them into its KV cache and computes only the
rest. ``kv_both`` does both, against its own pool (the side channel's address is the same).

Loads and saves are synchronous, inside the step (Brigade's contract): unlike vLLM's NixlConnector, which READs
straight out of the producer's paged GPU KV cache while the producer delays freeing those blocks, the producer
here keeps its own copy in the pool, so its requests finish and free their blocks as usual. A producer that does
not answer, refuses (another KV layout), or a READ that fails or times out is one WARNING; the request computes
those tokens (in the same step when the read failed), so outputs never change. Requests on a LoRA adapter are
neither saved nor loaded (the keys do not name adapter weights).

Anyone who can reach the side channel's port can read the pool's KV (prompts' content): bind it to loopback or a
private network.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from brigade.config import ConfigError, KVTransferConfig
from brigade.interfaces import KVConnectorMetadata
from brigade.kv_transfer import KVCacheLayout, KVConnectorBase, KVConnectorRole, PromptBlocks
from brigade_nixl.pool import BlockPool
from brigade_nixl.side_channel import PROTOCOL_VERSION, SideChannelClient, SideChannelError, SideChannelServer
from brigade_nixl.transfer import LoadError, SlotReader, make_agent, nixl_api

if TYPE_CHECKING:
    from brigade.interfaces import ConnectorRequest, SchedulerOutput

logger = logging.getLogger(__name__)

EXTRA_KEYS = ("host", "port", "pool_blocks", "backends", "timeout_s")
DEFAULTS = {"host": "127.0.0.1", "port": 5570, "pool_blocks": 2048, "backends": ["UCX"], "timeout_s": 5.0}
RETRY_AFTER_S = 10.0  # after the producer failed to answer, the consumer's scheduler asks again only this much later
MIN_LEASE_S = 30.0  # a lookup's lease lasts max(MIN_LEASE_S, 4 * timeout_s)


@dataclass(slots=True)
class BlockSave:
    """One block a producer copies into its pool: its id in this engine's KV cache and its key."""

    block_id: int
    key: str


@dataclass(slots=True)
class RequestLoad:
    """The blocks a consumer READs for one request: they hold its tokens from ``num_computed_tokens`` on."""

    req_id: str
    num_computed_tokens: int  # the local prefix-cache hit, where the loaded range begins
    block_ids: list[int]  # this engine's blocks that receive them, in order
    slot_ids: list[int]  # the producer's pool slots, in the same order
    producer: str  # the producer's NIXL agent name (a restarted producer has a new one)
    lease_id: int
    lease_deadline: float  # time.monotonic() after which the slots may be overwritten


@dataclass(slots=True)
class NixlConnectorMetadata(KVConnectorMetadata):
    """One step's work for the worker-role connector."""

    loads: list[RequestLoad] = field(default_factory=list)  # before the forward pass
    saves: list[BlockSave] = field(default_factory=list)  # after it


@dataclass(slots=True)
class _Lookup:
    """A waiting request's leased answer from the producer (until it is admitted)."""

    producer: str
    lease_id: int
    slot_ids: list[int]
    deadline: float


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class NixlConnector(KVConnectorBase):
    """KV blocks READ with NIXL from a producer's host pool. See the module docstring for the protocol.

    Counters (since start, for tests and logs): scheduler role ``num_matched_tokens`` (tokens the consumer was
    given instead of computing them); worker role ``num_loaded_tokens``, ``num_failed_loads`` (requests whose load
    fell back to computing) and ``num_saved_blocks``.

    Raises (construction):
        ConfigError: bad ``kv_connector_extra_config`` (see ``check_config``), NIXL not installed, none of
            ``backends`` available, or (a producer's worker) the side channel's port cannot be bound.
    """

    name = "NixlConnector"

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, layout: KVCacheLayout):
        super().__init__(config, role, layout)
        self.check_config(config)
        extra = {**DEFAULTS, **config.kv_connector_extra_config}
        self.host, self.port, self.timeout_s = extra["host"], extra["port"], float(extra["timeout_s"])
        self.backends = list(extra["backends"])
        self.block_size = layout.block_size
        self.address = f"{self.host}:{self.port}"
        # scheduler role
        self._blocks = PromptBlocks(layout)  # block keys, and the producer's prompt blocks to save
        self._lookups: dict[str, _Lookup] = {}  # waiting requests' leases, until admitted
        self._pending_loads: list[RequestLoad] = []  # admitted since the last build_connector_meta
        self._handshake_done = False
        self._channel_failed = False  # the last call to the producer got no answer: send it no releases
        self._retry_at = 0.0  # time.monotonic() before which the producer is not asked again
        self._warned = False  # the current outage was logged
        self.num_matched_tokens = 0
        # worker role
        self._failed_loads: dict[str, int] = {}
        self.num_loaded_tokens = 0
        self.num_failed_loads = 0
        self.num_saved_blocks = 0
        self.pool: BlockPool | None = None
        self._agent = None  # the producer's NIXL agent (a consumer's is its reader's)
        self._pool_reg = None
        self._server: SideChannelServer | None = None
        self._reader: SlotReader | None = None
        self._client: SideChannelClient | None = None  # the consumer's, to the producer's side channel
        if self.is_consumer:
            self._client = SideChannelClient(self.host, self.port, self.timeout_s)
        if role == KVConnectorRole.WORKER and self.is_producer:
            self._start_producer(extra["pool_blocks"])
        self._finalizer = weakref.finalize(self, _close_quietly, self._server, self._client)

    @classmethod
    def check_config(cls, config: KVTransferConfig) -> None:
        """``kv_connector_extra_config`` may hold ``host`` (the side channel's address: the producer binds it, the
        consumer connects to it; default 127.0.0.1), ``port`` (1-65535, default 5570), ``pool_blocks`` (the
        producer's pool size in KV blocks, > 0, default 2048), ``backends`` (NIXL backends, default ["UCX"]) and
        ``timeout_s`` (a consumer's wait for an answer or a READ, seconds, > 0, default 5).

        Raises:
            ConfigError: an unknown key or a bad value (one line naming it and what would be right), or NIXL is
                not installed.
        """
        extra = config.kv_connector_extra_config
        flag = "--kv-transfer-config kv_connector_extra_config"
        unknown = sorted(set(extra) - set(EXTRA_KEYS))
        if unknown:
            raise ConfigError(f"{flag} has unknown keys {unknown} for {cls.name}; allowed: {', '.join(EXTRA_KEYS)}")
        host = extra.get("host", DEFAULTS["host"])
        if not isinstance(host, str) or not host or any(c.isspace() or c in "/:" for c in host):
            raise ConfigError(f"{flag} host must be a host name or IPv4 address (a non-empty string), got {host!r}")
        port = extra.get("port", DEFAULTS["port"])
        if not _is_int(port) or not 1 <= port <= 65535:
            raise ConfigError(f"{flag} port must be a TCP port number (an int from 1 to 65535), got {port!r}")
        pool_blocks = extra.get("pool_blocks", DEFAULTS["pool_blocks"])
        if not _is_int(pool_blocks) or pool_blocks < 1:
            raise ConfigError(f"{flag} pool_blocks must be a positive int (KV blocks in the producer's host pool), "
                              f"got {pool_blocks!r}")
        backends = extra.get("backends", DEFAULTS["backends"])
        if not isinstance(backends, list) or not backends or not all(isinstance(b, str) and b for b in backends):
            raise ConfigError(f"{flag} backends must be a non-empty list of NIXL backend names (e.g. [\"UCX\"]), "
                              f"got {backends!r}")
        timeout_s = extra.get("timeout_s", DEFAULTS["timeout_s"])
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ConfigError(f"{flag} timeout_s must be a positive number of seconds, got {timeout_s!r}")
        nixl_api()

    def _start_producer(self, pool_blocks: int) -> None:
        """The producer's worker: the pool, registered with a new NIXL agent, and the side channel serving it."""
        self.pool = BlockPool(self.layout, pool_blocks, lease_s=max(MIN_LEASE_S, 4 * self.timeout_s))
        self._agent = make_agent(f"brigade-nixl-producer-{os.getpid()}-{uuid.uuid4().hex[:8]}", self.backends,
                                 progress_thread=True)
        self._pool_reg = self._agent.register_memory(self.pool.tensor)
        try:
            self._server = SideChannelServer(self.host, self.port, self._answer)
        except OSError as exc:
            self._agent.deregister_memory(self._pool_reg)
            raise ConfigError(f"--kv-transfer-config kv_connector_extra_config port {self.port}: {exc} (another "
                              f"producer there? pick a free port)") from None
        logger.info("NIXL producer: pool of %d blocks (%.1f MiB, %s) served on tcp://%s", pool_blocks,
                    pool_blocks * self.pool.slot_bytes / 2**20, self._agent.name, self.address)

    # ---- scheduler role -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: ConnectorRequest, num_computed_tokens: int) -> int:
        if not self.is_consumer or request.lora_name is not None:
            return 0
        previous = self._lookups.pop(request.request_id, None)  # asked again: it was not admitted last time
        first = num_computed_tokens // self.block_size
        last = (request.num_tokens - 1) // self.block_size  # at most num_tokens - 1 tokens: logits must exist
        lookup = None
        if last > first and self._producer_usable():
            lookup = self._lookup(self._blocks.keys(request)[first:last], previous)
        elif previous is not None:
            self._release([previous.lease_id])
        if lookup is None:
            return 0
        self._lookups[request.request_id] = lookup
        return len(lookup.slot_ids) * self.block_size

    def _producer_usable(self) -> bool:
        """Whether to ask the producer now: its handshake succeeded (done once, and again after a failure)."""
        if self._handshake_done:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._client.call(self._handshake_request())
        except SideChannelError as exc:
            self._producer_failed(f"handshake: {exc}")
            return False
        self._handshake_done = True
        self._channel_failed = False
        if self._warned:
            logger.info("NixlConnector: the producer at %s answers again", self.address)
            self._warned = False
        return True

    def _handshake_request(self) -> dict:
        return {"op": "handshake", "version": PROTOCOL_VERSION, "layout": self.layout.key()}

    def _lookup(self, keys: list[str], previous: _Lookup | None) -> _Lookup | None:
        sent = time.monotonic()
        try:
            reply = self._client.call({"op": "lookup", "layout": self.layout.key(), "keys": keys,
                                       "release": previous.lease_id if previous else 0})
            slot_ids = [int(s) for s in reply["slot_ids"]][:len(keys)]
            lookup = _Lookup(str(reply["agent"]), int(reply["lease"]), slot_ids, sent + float(reply["lease_s"]))
        except (SideChannelError, KeyError, TypeError, ValueError) as exc:
            self._producer_failed(f"lookup: {type(exc).__name__}: {exc}")
            return None
        return lookup if lookup.slot_ids else None

    def _producer_failed(self, reason: str) -> None:
        self._handshake_done = False
        self._channel_failed = True
        self._retry_at = time.monotonic() + RETRY_AFTER_S
        if not self._warned:
            logger.warning("NixlConnector: the producer at %s cannot be used (%s); requests compute all their tokens "
                           "until it answers (asked again every %g s)", self.address, reason, RETRY_AFTER_S)
            self._warned = True

    def _release(self, lease_ids: list[int]) -> None:
        """Tell the producer these leases are over; best effort (a lease also expires by itself, so nothing is sent
        to a producer that just failed to answer)."""
        if lease_ids and self._client is not None and not self._channel_failed:
            try:
                self._client.call({"op": "release", "leases": lease_ids})
            except SideChannelError as exc:
                self._channel_failed = True
                logger.debug("NixlConnector: could not release leases %s: %s", lease_ids, exc)

    def update_state_after_alloc(self, request: ConnectorRequest, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        lookup = self._lookups.pop(request.request_id, None)
        if num_external_tokens > 0 and lookup is not None:
            first = request.num_computed_tokens // self.block_size
            num_blocks = num_external_tokens // self.block_size
            self._pending_loads.append(RequestLoad(
                request.request_id, request.num_computed_tokens, list(block_ids[first:first + num_blocks]),
                lookup.slot_ids[:num_blocks], lookup.producer, lookup.lease_id, lookup.deadline))
            self.num_matched_tokens += num_external_tokens
        elif lookup is not None:
            self._release([lookup.lease_id])
        if self.is_producer:
            self._blocks.track(request, block_ids)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> NixlConnectorMetadata:
        metadata = NixlConnectorMetadata(loads=self._pending_loads)
        self._pending_loads = []
        metadata.saves = [BlockSave(block_id, key) for block_id, key in self._blocks.completed(scheduler_output)]
        return metadata

    def request_finished(self, request: ConnectorRequest, block_ids: list[int]) -> bool:
        self._blocks.forget(request.request_id)
        lookup = self._lookups.pop(request.request_id, None)
        if lookup is not None:  # finished (aborted) while waiting
            self._release([lookup.lease_id])
        return False  # saves are done within their step

    # ---- worker role: consumer ------------------------------------------------------------------
    def start_load_kv(self, metadata: NixlConnectorMetadata, kv_caches: list[torch.Tensor]) -> None:
        """READ each request's slots from the producer's pool, then copy them into ``kv_caches``; a request whose
        read fails loads nothing (``wait_for_load`` reports it) and its lease is released all the same."""
        dim = self.layout.block_dim
        self._channel_failed = False
        for load in metadata.loads:
            try:
                kv = self._read(load)  # [num_blocks, num_layers, *block_shape]
            except Exception as exc:  # NIXL raises its own types; any failure means "compute instead"
                self._channel_failed |= isinstance(exc, SideChannelError)
                self._failed_loads[load.req_id] = load.num_computed_tokens
                self.num_failed_loads += 1
                logger.warning("NixlConnector: request %s computes its %d tokens from token %d instead of loading "
                               "them from %s: %s", load.req_id, len(load.block_ids) * self.block_size,
                               load.num_computed_tokens, self.address, _one_line(exc))
                continue
            for block_id, block in zip(load.block_ids, kv):
                for layer, cache in enumerate(kv_caches):
                    cache.select(dim, block_id).copy_(block[layer])
            self.num_loaded_tokens += len(load.block_ids) * self.block_size
        self._release([load.lease_id for load in metadata.loads])

    def _read(self, load: RequestLoad) -> torch.Tensor:
        if time.monotonic() + self.timeout_s > load.lease_deadline:
            raise LoadError("its lease on the producer's slots ends before the read could time out")
        reader = self._reader_for(load.producer)
        return reader.read(load.slot_ids)

    def _reader_for(self, producer: str) -> SlotReader:
        """The reader connected to ``producer`` (handshaking once, and again when the producer restarted)."""
        if self._reader is None:
            agent = make_agent(f"brigade-nixl-consumer-{os.getpid()}-{uuid.uuid4().hex[:8]}", self.backends,
                               progress_thread=False)
            self._reader = SlotReader(agent, self.layout, self.timeout_s)  # kv_both: an agent beside the producer's
        if self._reader.producer != producer:
            reply = self._client.call(self._handshake_request())
            if reply.get("agent") != producer:
                raise LoadError(f"the producer restarted (agent {reply.get('agent')!r}, the lookup named {producer!r})")
            self._reader.connect(reply)
        return self._reader

    def wait_for_load(self) -> dict[str, int]:
        failed, self._failed_loads = self._failed_loads, {}
        return failed

    # ---- worker role: producer ------------------------------------------------------------------
    def save_kv(self, metadata: NixlConnectorMetadata, kv_caches: list[torch.Tensor]) -> None:
        """Copy each named block into a pool slot ([num_layers, *block_shape]), skipping keys already there."""
        if self.pool is None:
            return
        dim = self.layout.block_dim
        for save in metadata.saves:
            slot_id = self.pool.reserve(save.key)
            if slot_id is None:
                continue  # already in the pool, or every slot is leased
            slot = self.pool.tensor[slot_id]
            for layer, cache in enumerate(kv_caches):
                slot[layer].copy_(cache.select(dim, save.block_id))
            self.pool.publish(save.key, slot_id)
            self.num_saved_blocks += 1

    def _answer(self, request: dict) -> dict:
        """The side channel's handler (on its thread): see ``side_channel`` for the messages."""
        op = request.get("op")
        if op == "release":
            self.pool.release([int(i) for i in request.get("leases", ())])
            return {}
        if request.get("layout") != self.layout.key():
            return {"error": f"KV layout mismatch: the producer's is {self.layout.key()!r}, the consumer's "
                             f"{request.get('layout')!r}; blocks only move between equal layouts"}
        if op == "handshake":
            if request.get("version") != PROTOCOL_VERSION:
                return {"error": f"side channel protocol {request.get('version')!r}; this producer speaks "
                                 f"{PROTOCOL_VERSION}"}
            return {"agent": self._agent.name, "agent_metadata": self._agent.get_agent_metadata(),
                    "base_address": self.pool.base_address, "slot_bytes": self.pool.slot_bytes,
                    "num_slots": self.pool.num_slots, "layout": self.layout.key(), "lease_s": self.pool.lease_s}
        if op == "lookup":
            if request.get("release"):
                self.pool.release([int(request["release"])])
            lease_id, slot_ids = self.pool.lookup([str(k) for k in request["keys"]])
            return {"agent": self._agent.name, "lease": lease_id, "slot_ids": slot_ids, "lease_s": self.pool.lease_s}
        return {"error": f"unknown op {op!r}"}

    # ---- both roles -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the side channel (the port is free afterwards), close the consumer's socket, and give the pool's
        and staging's memory back to NIXL. Idempotent."""
        self._finalizer()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._pool_reg is not None:
            try:
                self._agent.deregister_memory(self._pool_reg)
            except Exception as exc:  # shutting down: a NIXL error here changes nothing
                logger.debug("NIXL pool deregistration: %s", exc)
            self._pool_reg = None
        self._agent = None  # its progress thread stops with it


def _close_quietly(server: SideChannelServer | None, client: SideChannelClient | None) -> None:
    """Close the side channel's sockets and thread (at shutdown, else at interpreter exit)."""
    for channel in (server, client):
        if channel is not None:
            channel.close()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
