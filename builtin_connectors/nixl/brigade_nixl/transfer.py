"""NIXL for the connector: importing it, making an agent, and the consumer's READ of pool slots (``SlotReader``).

NIXL (NVIDIA Inference Xfer Library) moves bytes between registered memory regions of two agents through a
backend (UCX here, on host memory). The producer registers its pool tensor; the consumer registers a staging
tensor of its own, loads the producer's agent metadata (from the side channel's handshake), prepares one
descriptor per remote slot and per local staging slot once, then reads any slots by index
(``make_prepped_xfer``), as vLLM's NixlConnector does with KV blocks.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from types import ModuleType

import numpy as np
import torch

from brigade.config import ConfigError
from brigade.kv_transfer import KVCacheLayout

logger = logging.getLogger(__name__)

NIXL_MODULES = ("nixl._api", "nixl_cu13._api", "nixl_cu12._api")  # the meta package first, then the CUDA variants
_POLL_S = 0.0001  # between two looks at a transfer's state
PROGRESS_DELAY_US = 100  # the producer's progress thread pauses this long between rounds (0 = one busy core)


class LoadError(Exception):
    """A consumer's read of pool slots failed (the message says why, in one line)."""


def nixl_api() -> ModuleType:
    """The NIXL Python API module (``nixl._api`` with the ``nixl`` meta package, else ``nixl_cu13._api``, else
    ``nixl_cu12._api``).

    Raises:
        ConfigError: none of them imports (one line saying what to install).
    """
    reasons = []
    for name in NIXL_MODULES:
        try:
            return importlib.import_module(name)
        except (ImportError, OSError) as exc:
            reasons.append(f"{name}: {exc}")
    raise ConfigError("NixlConnector needs the NIXL Python package: pip install nixl-cu13 (none of "
                      f"{', '.join(NIXL_MODULES)} imports; {reasons[-1]})")


def make_agent(name: str, backends: list[str], *, progress_thread: bool):
    """A NIXL agent named ``name`` with ``backends`` (e.g. ["UCX"]).

    A producer needs NIXL's progress thread: a consumer's READ only completes while the target's backend makes
    progress (with UCX over TCP, nothing moves at all). The Python API runs that thread without a pause
    (``pthrDelay`` 0), which keeps one core busy for good; the agent is made with ``PROGRESS_DELAY_US`` instead.
    A consumer drives its own transfers (``check_xfer_state``) and runs no progress thread.

    Raises:
        ConfigError: NIXL is not installed, or none of ``backends`` is available in this NIXL build.
    """
    api = nixl_api()
    config = api.nixl_agent_config(enable_prog_thread=progress_thread, backends=list(backends))
    with _progress_delay(api, PROGRESS_DELAY_US):
        agent = api.nixl_agent(name, config)
    if not agent.backends:
        raise ConfigError(f"--kv-transfer-config kv_connector_extra_config backends {backends}: none is available "
                          f"in this NIXL build; available: {', '.join(agent.plugin_list) or 'none'}")
    return agent


@contextlib.contextmanager
def _progress_delay(api: ModuleType, delay_us: int):
    """While agents are made, give their ``nixlAgentConfig`` a ``pthrDelay`` of ``delay_us`` microseconds: the
    Python API (nixl 1.5) sets 0 and has no argument for it, so its call to the bindings' ``nixlAgent`` is wrapped.
    A NIXL without that attribute is left alone (its progress thread then runs at its own pace)."""
    bindings = getattr(api, "nixlBind", None)
    make = getattr(bindings, "nixlAgent", None)
    if make is None:
        yield
        return

    def with_delay(name, config):
        config.pthrDelay = delay_us
        return make(name, config)

    bindings.nixlAgent = with_delay
    try:
        yield
    finally:
        bindings.nixlAgent = make


def slot_descriptors(base_address: int, slot_bytes: int, num_slots: int) -> np.ndarray:
    """One NIXL descriptor per slot of a contiguous region: [num_slots, 3] uint64 rows (address, bytes, device 0)."""
    descs = np.empty((num_slots, 3), dtype=np.uint64)
    descs[:, 0] = base_address + np.arange(num_slots, dtype=np.uint64) * slot_bytes
    descs[:, 1] = slot_bytes
    descs[:, 2] = 0
    return descs


class SlotReader:
    """Reads slots of one producer's pool into a local staging tensor with NIXL READs.

    Invariant: ``producer`` is None, or names the producer agent whose metadata is loaded and whose slots are
    prepared (``_remote``); ``_staging`` is registered with ``agent`` and prepared (``_local``).

    Args:
        agent: this consumer's NIXL agent.
        layout: the consumer's KV cache layout (the staging tensor's dtype and block shape).
        timeout_s: the longest a read may take, seconds.
    """

    def __init__(self, agent, layout: KVCacheLayout, timeout_s: float):
        self.agent = agent
        self.timeout_s = timeout_s
        self.dtype = getattr(torch, layout.dtype)
        self.block_shape = (layout.num_layers, *layout.block_shape)
        self.slot_bytes = int(np.prod(self.block_shape)) * torch.empty((), dtype=self.dtype).element_size()
        self.producer: str | None = None  # the producer's agent name
        self._remote_name = None
        self._remote = None  # prepared descriptors of the producer's slots
        self._num_remote_slots = 0
        self._staging: torch.Tensor | None = None  # [capacity, num_layers, *block_shape]
        self._staging_reg = None
        self._local = None
        self._abandoned: list[torch.Tensor] = []  # staging a timed-out READ may still write: never reused or freed

    def connect(self, handshake: dict) -> None:
        """Load the producer's agent metadata and prepare its slots, from its handshake reply.

        Raises:
            LoadError: its slots are not the size of this consumer's blocks.
        """
        self.disconnect()
        if handshake["slot_bytes"] != self.slot_bytes:
            raise LoadError(f"the producer's pool slots are {handshake['slot_bytes']} bytes, this consumer's blocks "
                            f"{self.slot_bytes}")
        self._remote_name = self.agent.add_remote_agent(handshake["agent_metadata"])
        descs = slot_descriptors(handshake["base_address"], self.slot_bytes, handshake["num_slots"])
        self._remote = self.agent.prep_xfer_dlist(self._remote_name, descs, "DRAM")
        self._num_remote_slots = handshake["num_slots"]
        self.producer = handshake["agent"]

    def read(self, slot_ids: list[int]) -> torch.Tensor:
        """READ the producer's ``slot_ids`` and wait for them.

        Returns:
            A view of the staging tensor, [len(slot_ids), num_layers, *block_shape] in the layout's dtype, valid
            until the next ``read``.
        Raises:
            LoadError: not connected, a slot id out of range, the transfer failed, or it took over ``timeout_s``.
        """
        if self._remote is None:
            raise LoadError("not connected to a producer")
        if not all(0 <= s < self._num_remote_slots for s in slot_ids):
            raise LoadError(f"slot ids out of the producer's range 0..{self._num_remote_slots - 1}")
        num = len(slot_ids)
        self._ensure_staging(num)
        handle = self.agent.make_prepped_xfer("READ", self._local, list(range(num)), self._remote, list(slot_ids))
        done = False
        try:
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + self.timeout_s
            while state != "DONE":
                if state == "ERR":
                    raise LoadError("the NIXL READ failed")
                if time.monotonic() > deadline:
                    raise LoadError(f"the NIXL READ of {num} blocks took over {self.timeout_s:g} s")
                time.sleep(_POLL_S)
                state = self.agent.check_xfer_state(handle)
            done = True
        finally:
            try:
                self.agent.release_xfer_handle(handle)
            except Exception:  # still active and not cancellable: its target must never be reused
                done = False
            if not done:
                self._abandon_staging()
        return self._staging[:num]

    def _ensure_staging(self, num_blocks: int) -> None:
        if self._staging is not None and self._staging.shape[0] >= num_blocks:
            return
        capacity = max(num_blocks, 16, 0 if self._staging is None else 2 * self._staging.shape[0])
        self._release_staging()
        self._staging = torch.empty((capacity, *self.block_shape), dtype=self.dtype)
        self._staging_reg = self.agent.register_memory(self._staging)
        descs = slot_descriptors(self._staging.data_ptr(), self.slot_bytes, capacity)
        self._local = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", descs, "DRAM")

    def _abandon_staging(self) -> None:
        if self._staging is not None:
            self._abandoned.append(self._staging)  # registered and referenced for good: a late write lands here
            self._staging = self._staging_reg = self._local = None

    def _release_staging(self) -> None:
        if self._local is not None:
            self.agent.release_dlist_handle(self._local)
        if self._staging_reg is not None:
            self.agent.deregister_memory(self._staging_reg)
        self._staging = self._staging_reg = self._local = None

    def disconnect(self) -> None:
        """Forget the producer (its prepared slots and metadata); idempotent."""
        if self._remote is not None:
            self.agent.release_dlist_handle(self._remote)
        if self._remote_name is not None:
            self.agent.remove_remote_agent(self._remote_name)
        self._remote = self._remote_name = self.producer = None
        self._num_remote_slots = 0

    def close(self) -> None:
        """Disconnect and give the staging memory back to NIXL; idempotent, never raises."""
        try:
            self.disconnect()
            self._release_staging()
        except Exception as exc:  # shutting down: a NIXL error here changes nothing
            logger.debug("NIXL reader close: %s", exc)
