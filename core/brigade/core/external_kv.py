"""ExternalKV: the scheduler's side of a KV connector (``--kv-transfer-config``, vLLM v1's
``KVConnectorBase_V1`` scheduler role): KV an external store supplies instead of computing it.

For each waiting request being admitted the scheduler asks ``num_matched_tokens``: how many tokens after its
local prefix-cache hit the store holds. Those tokens get blocks and count as computed; ``allocated`` tells
the connector which blocks, and ``metadata`` (at the end of ``schedule``) rides in
``SchedulerOutput.kv_connector_metadata`` to the worker-role connector, which loads before the forward pass
and saves after it.
"""

from __future__ import annotations

from brigade.core.request import Request
from brigade.interfaces import KVConnectorMetadata, SchedulerOutput
from brigade.kv_transfer.base import KVConnectorBase


class ExternalKV:
    """Decides how many tokens of a request the connector supplies, and keeps the connector informed.

    Contract: answers from the request and its local hit only (never the scheduler's queues); without a
    connector every answer is 0 / None and every notice a no-op. Owns the scheduler-role connector and the
    count of tokens it supplied since start.
    """

    def __init__(self, connector: KVConnectorBase | None):
        self.connector = connector  # the scheduler-role KV connector, or None
        self.num_external_tokens_total = 0  # tokens the connector supplied instead of computing them, since start

    def num_matched_tokens(self, request: Request, num_hit: int) -> int:
        """Tokens of a waiting request after its local hit (``num_hit``) that the connector will load; 0
        without a connector and for requests with prompt logprobs (loaded tokens are not computed, so get no
        logprobs).

        Raises:
            ValueError: the connector answered beyond ``num_tokens - 1`` or a negative count (a connector bug
                that would otherwise leave no token to sample from).
        """
        if self.connector is None or request.sampling_params.prompt_logprobs is not None:
            return 0
        num_external = self.connector.get_num_new_matched_tokens(request, num_hit)
        if num_external < 0 or num_hit + num_external > request.num_tokens - 1:
            raise ValueError(f"KV connector {type(self.connector).__name__} matched {num_external} tokens of "
                             f"request {request.request_id} after {num_hit} local ones; at most "
                             f"{request.num_tokens - 1 - num_hit} (num_tokens - 1 in all) may be matched")
        return num_external

    def allocated(self, request: Request, block_ids: list[int], num_external: int) -> None:
        """``request`` was admitted with ``block_ids`` (its whole block table); its ``num_computed_tokens`` is
        still the local hit, and the ``num_external`` tokens after it are to be loaded."""
        if self.connector is not None:
            self.connector.update_state_after_alloc(request, block_ids, num_external)
            self.num_external_tokens_total += num_external

    def metadata(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata | None:
        """The step's instructions for the worker-role connector (None without a connector); called once the
        scheduled requests' ``num_computed_tokens`` count this step's tokens."""
        return self.connector.build_connector_meta(scheduler_output) if self.connector is not None else None

    def check_finished(self, request: Request, block_ids: list[int]) -> None:
        """Tell the connector ``request`` finished and its blocks are about to be freed.

        Raises:
            NotImplementedError: the connector asked to keep the blocks for an asynchronous save; Brigade's
                connectors save within the step.
        """
        if self.connector is not None and self.connector.request_finished(request, block_ids):
            raise NotImplementedError(f"KV connector {type(self.connector).__name__} asked to keep the blocks of "
                                      f"request {request.request_id} for an asynchronous save; Brigade's "
                                      "connectors save within the step")
