"""The scheduler's side of the KV connector contract, with a fake connector (no tensors, milliseconds)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "core"))

from test_scheduler import make_request, make_scheduler, run_step  # noqa: E402

from brigade.config import KVTransferConfig  # noqa: E402
from brigade.interfaces import KVConnectorMetadata  # noqa: E402
from brigade.kv_transfer import KVCacheLayout, KVConnectorBase, KVConnectorRole  # noqa: E402

LAYOUT = KVCacheLayout(model="m", dtype="float32", block_size=4, num_layers=1, block_shape=(2, 4, 1, 8), block_dim=1)


@dataclass(slots=True)
class FakeMeta(KVConnectorMetadata):
    loads: dict[str, tuple[int, list[int]]] = field(default_factory=dict)  # req -> (first token, block ids)


class FakeConnector(KVConnectorBase):
    """Claims ``stored`` tokens of every prompt (capped as the contract says) and records the calls."""

    def __init__(self, stored: int, overclaim: bool = False):
        super().__init__(KVTransferConfig("fake", "kv_consumer"), KVConnectorRole.SCHEDULER, LAYOUT)
        self.stored = stored
        self.overclaim = overclaim
        self.pending: dict[str, tuple[int, list[int]]] = {}
        self.finished: list[str] = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self.overclaim:
            return request.num_tokens
        cap = (request.num_tokens - 1) // 4 * 4
        return max(0, min(self.stored, cap) - num_computed_tokens)

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        if num_external_tokens:
            first = request.num_computed_tokens // 4
            self.pending[request.request_id] = (request.num_computed_tokens,
                                                block_ids[first:first + num_external_tokens // 4])

    def build_connector_meta(self, scheduler_output):
        meta, self.pending = FakeMeta(self.pending), {}
        return meta

    def request_finished(self, request, block_ids):
        self.finished.append(request.request_id)
        return False

    def start_load_kv(self, metadata, kv_caches):
        raise AssertionError("worker role")

    def save_kv(self, metadata, kv_caches):
        raise AssertionError("worker role")


def connected_scheduler(connector, **kw):
    sched = make_scheduler(**kw)
    sched.kv_connector = connector
    return sched


def test_external_tokens_are_allocated_counted_and_sent_to_the_worker():
    connector = FakeConnector(stored=8)
    sched = connected_scheduler(connector)
    sched.add_request(make_request("a", range(1, 12)))  # 11 tokens: 2 whole blocks stored, 3 tokens computed
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 3}
    new = out.scheduled_new_reqs[0]
    assert new.num_computed_tokens == 8 and len(new.block_ids[0]) == 3
    assert out.kv_connector_metadata.loads == {"a": (0, new.block_ids[0][:2])}
    request = sched.requests["a"]
    assert request.num_cached_tokens == 8 and sched.num_external_tokens_total == 8
    while sched.has_unfinished_requests():
        run_step(sched)
    assert connector.finished == ["a"]
    assert sched.kv_cache_manager.get_num_free_blocks() == sched.kv_cache_manager.num_usable_blocks


def test_local_prefix_hits_come_first_and_the_cap_leaves_a_token_to_compute():
    connector = FakeConnector(stored=0)
    sched = connected_scheduler(connector)
    sched.add_request(make_request("a", range(1, 10)))  # 9 tokens: 2 full blocks cached locally afterwards
    while sched.has_unfinished_requests():
        run_step(sched)
    connector.stored = 100
    sched.add_request(make_request("b", range(1, 13)))  # 12 tokens: 8 local, then at most 11 - 8 -> 0 whole blocks
    out, _ = run_step(sched)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 8 and out.num_scheduled_tokens == {"b": 4}
    assert out.kv_connector_metadata.loads == {}
    sched.add_request(make_request("c", range(1, 18)))  # 17 tokens: 12 local (b's blocks) + 4 external, 1 computed
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens["c"] == 1
    first, block_ids = out.kv_connector_metadata.loads["c"]
    assert first == 12 and block_ids == out.scheduled_new_reqs[0].block_ids[0][3:4]


def test_prompt_logprobs_requests_load_nothing_and_overclaims_are_refused():
    sched = connected_scheduler(FakeConnector(stored=8))
    sched.add_request(make_request("a", range(1, 12), prompt_logprobs=0))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 11} and out.kv_connector_metadata.loads == {}
    sched = connected_scheduler(FakeConnector(stored=8, overclaim=True))
    sched.add_request(make_request("b", range(1, 12)))
    with pytest.raises(ValueError, match=r"matched 11 tokens of request b after 0 local ones; at most 10"):
        sched.schedule()
