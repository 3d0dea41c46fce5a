"""The KV connector's load before a step's forward pass (vLLM v1's KV connector API).

With ``--kv-transfer-config`` the runner holds the worker-role connector: before the forward pass it loads
what the step's ``kv_connector_metadata`` names into the KV cache, after it the runner has it save. A load
that fails is recomputed in the same step (the request's loaded range joins its scheduled tokens), so the
scheduler's accounting holds and the outputs are those of an engine without connector.
"""

from __future__ import annotations

import torch

from brigade.interfaces import KVConnectorMetadata
from brigade.kv_transfer import KVConnectorBase
from brigade.worker.request_states import RequestStates


def load_kv(connector: KVConnectorBase, metadata: KVConnectorMetadata, kv_caches: list[torch.Tensor],
            requests: RequestStates, num_scheduled: dict[str, int]) -> dict[str, int]:
    """Have ``connector`` load this step's blocks into ``kv_caches`` and wait; returns the tokens to compute
    per request: ``num_scheduled``, plus, for a request whose load failed, its loaded range (computed instead
    of loaded; its state's ``num_computed_tokens`` goes back to where that range began)."""
    connector.start_load_kv(metadata, kv_caches)
    failed = connector.wait_for_load()
    if not failed:
        return num_scheduled
    num_scheduled = dict(num_scheduled)
    for rid, num_valid in failed.items():
        state = requests.get(rid)
        if state is None or rid not in num_scheduled or not 0 <= num_valid < state.num_computed_tokens:
            continue
        num_scheduled[rid] += state.num_computed_tokens - num_valid
        state.num_computed_tokens = num_valid
    return num_scheduled
