"""The KV connector contract: moving KV blocks between Brigade instances (vLLM's KVConnectorBase_V1).

A connector class is registered by a plugin (``register_kv_connectors``) and instantiated twice per engine, once
per role:

- **scheduler role** (in the EngineCore, beside the Scheduler): says how many tokens of a new request an
  external store holds beyond the local prefix-cache hit (``get_num_new_matched_tokens``), is told which blocks
  the scheduler gave them (``update_state_after_alloc``), and writes one ``KVConnectorMetadata`` per step
  (``build_connector_meta``) that travels to the workers inside the ``SchedulerOutput``. It never touches tensors.
- **worker role** (in each worker, beside the ModelRunner): before the forward pass it loads what the metadata
  names into the paged KV cache (``start_load_kv``, ``wait_for_load``); after it, it saves (``save_kv``). It never
  decides who runs.

This first version is synchronous: ``wait_for_load`` returns once the loaded KV is in the cache and ``save_kv``
returns once the KV is stored, both inside the step, so the scheduler never has to keep a finished request's
blocks alive (``request_finished`` returns False) and no request waits across steps for a transfer.
"""

from __future__ import annotations

import enum
import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from brigade.config import KVTransferConfig
    from brigade.interfaces import ConnectorRequest, KVConnectorMetadata, SchedulerOutput


class KVConnectorRole(enum.Enum):
    """Where a connector instance runs."""

    SCHEDULER = 0  # in the EngineCore, beside the Scheduler
    WORKER = 1  # in each worker, beside the ModelRunner


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """What the KV blocks of this engine look like: a stored block is only reusable by an engine with the same
    layout (same model files, dtype, block size and per-block tensor shape).

    Built by the model runner once its KV cache exists (``ModelRunner.kv_cache_layout``); the engine core hands
    the same value to the scheduler-role connector.
    """

    model: str  # identity of the weights: the model directory's real path (+ quantization, dummy seed)
    dtype: str  # torch dtype of the KV cache, e.g. "float32"
    block_size: int  # tokens per block
    num_layers: int
    block_shape: tuple[int, ...]  # one layer's one block: the cache tensor's shape without its block dimension
    block_dim: int  # which dimension of a layer's cache tensor indexes blocks

    def key(self) -> str:
        """A one-line description of the layout; two engines can share KV blocks when their keys are equal."""
        shape = "x".join(map(str, self.block_shape))
        return (f"model={self.model};dtype={self.dtype};block_size={self.block_size};layers={self.num_layers};"
                f"block_shape={shape};block_dim={self.block_dim}")

    def digest(self) -> str:
        """sha256 of ``key()``, hex (a short, file-name-safe form of the layout)."""
        return hashlib.sha256(self.key().encode()).hexdigest()


class KVConnectorBase(ABC):
    """A KV connector, in one of its two roles (``role``). Subclasses implement both roles in one class.

    Invariant: the scheduler-role methods run only on the instance made with ``KVConnectorRole.SCHEDULER``, the
    worker-role methods only on the one made with ``KVConnectorRole.WORKER``; the two share nothing but the
    metadata messages.

    Args:
        config: the engine's ``--kv-transfer-config`` (``kv_role`` and ``kv_connector_extra_config``).
        role: which side this instance plays.
        layout: the engine's KV cache layout (the same on both sides).
    """

    name: ClassVar[str] = "KVConnectorBase"

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, layout: KVCacheLayout):
        self.config = config
        self.role = role
        self.layout = layout

    @classmethod
    def check_config(cls, config: KVTransferConfig) -> None:
        """Validate ``kv_connector_extra_config`` before anything loads (``check_kv_transfer_config``).

        Raises:
            ConfigError: one line naming the bad key or value and what would be right.
        """

    @property
    def is_producer(self) -> bool:
        """Saves KV for other instances (kv_producer or kv_both)."""
        return self.config.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        """Loads KV other instances saved (kv_consumer or kv_both)."""
        return self.config.kv_role in ("kv_consumer", "kv_both")

    # ---- scheduler role -------------------------------------------------------------------------
    @abstractmethod
    def get_num_new_matched_tokens(self, request: ConnectorRequest, num_computed_tokens: int) -> int:
        """How many of a waiting request's tokens the external store can provide beyond those already computed.

        Only the longest prefix that is really available counts. The answer is whole blocks and, with
        ``num_computed_tokens``, at most ``request.num_tokens - 1`` tokens, so at least one token is computed and
        the step yields logits (as the local prefix cache caps its hits).

        Args:
            request: a waiting request about to be admitted (it holds no blocks).
            num_computed_tokens: tokens the local prefix cache already covers (a multiple of the block size).
        Returns:
            The number of external tokens, 0 when none.
        """

    @abstractmethod
    def update_state_after_alloc(self, request: ConnectorRequest, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """The scheduler admitted ``request`` and gave it blocks. Called for every admitted request.

        At the call, ``request.num_computed_tokens`` is the local prefix-cache hit; the external tokens (if
        ``num_external_tokens`` > 0) are the ``num_external_tokens`` tokens right after it, and ``block_ids`` is
        the request's whole block table. Whether to load is decided by ``num_external_tokens``, never by whether
        there are blocks.
        """

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """This step's instructions for the worker-role connector (what to load before the forward pass and
        what to save after it). Called at the end of ``Scheduler.schedule``, once the scheduled requests'
        ``num_computed_tokens`` count this step's tokens; it drains the state built since the last call."""

    def request_finished(self, request: ConnectorRequest, block_ids: list[int]) -> bool:
        """A request finished (or was aborted) and its blocks are about to be freed.

        Returns:
            True to keep the blocks until an asynchronous save is done. Brigade's connectors save within the step
            (``save_kv`` returns once stored), so this is False; the scheduler refuses True for now.
        """
        return False

    # ---- worker role ----------------------------------------------------------------------------
    @abstractmethod
    def start_load_kv(self, metadata: KVConnectorMetadata, kv_caches: list[torch.Tensor]) -> None:
        """Start loading the blocks ``metadata`` names into ``kv_caches`` (one paged tensor per layer, laid out
        as ``layout`` says). Called before the forward pass of every step that has metadata."""

    def wait_for_load(self) -> dict[str, int]:
        """Wait until everything ``start_load_kv`` started is in the KV cache.

        Returns:
            The requests whose load failed, each mapped to the number of its tokens whose KV is really in the
            cache (where its loaded range began). The model runner computes the rest in this step, so a failed
            load costs time, never correctness. Empty when all went well.
        """
        return {}

    @abstractmethod
    def save_kv(self, metadata: KVConnectorMetadata, kv_caches: list[torch.Tensor]) -> None:
        """Save the blocks ``metadata`` names from ``kv_caches``, after this step's forward pass wrote them.
        Returns once they are stored; a failed save is logged, never raised (the request itself is fine)."""

    # ---- both roles -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Release what this instance holds (threads, sockets, registered memory). The engine calls it once when
        it shuts down (``EngineCore.shutdown`` for the scheduler role, the worker's ``shutdown`` for the worker
        role); it must be idempotent and must not raise. The default does nothing."""
