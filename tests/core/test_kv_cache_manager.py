"""KVCacheManager through its public behaviour only: ``allocate_slots`` gives a request room for N more tokens or
refuses without changing anything, ``get_computed_blocks`` finds the cached prefix (capped so one token is always
computed), and ``free`` returns every block to the pool. Counts and token numbers, no internals, no tensors."""

from __future__ import annotations

import pytest
from scheduler_steps import make_request

from brigade.core.kv_cache_manager import KVCacheManager

BLOCK = 4


def make_manager(num_blocks: int = 9, caching: bool = True) -> KVCacheManager:
    """``num_blocks`` blocks of ``BLOCK`` tokens (one is the pool's null block)."""
    return KVCacheManager(num_blocks=num_blocks, block_size=BLOCK, enable_caching=caching)


def compute(manager: KVCacheManager, request, num_tokens: int, hits=(), num_hit_tokens: int = 0) -> None:
    """Allocate ``num_tokens`` more tokens (after ``num_hit_tokens`` cached ones) and mark them computed."""
    assert manager.allocate_slots(request, num_tokens, hits, num_hit_tokens) is not None
    request.num_computed_tokens += num_hit_tokens + num_tokens


def test_a_prompt_takes_whole_blocks_and_free_returns_them():
    manager = make_manager()
    free = manager.get_num_free_blocks()
    request = make_request("a", range(1, 11))  # 10 tokens: 3 blocks of 4
    compute(manager, request, 10)
    assert manager.get_num_free_blocks() == free - 3
    assert manager.usage == pytest.approx(3 / manager.num_usable_blocks)
    manager.free(request)
    assert manager.get_num_free_blocks() == free and manager.usage == 0.0


def test_decode_takes_a_new_block_only_at_a_block_boundary():
    manager = make_manager()
    request = make_request("a", range(1, 7))  # 6 tokens: 2 blocks, 2 free slots in the second
    compute(manager, request, 6)
    free = manager.get_num_free_blocks()
    for token, expected_free in ((7, free), (8, free), (9, free - 1)):
        request.all_token_ids.append(token)
        request.output_token_ids.append(token)
        compute(manager, request, 1)
        assert manager.get_num_free_blocks() == expected_free, token


def test_a_request_that_does_not_fit_is_refused_and_nothing_changes():
    manager = make_manager(num_blocks=4)  # 3 usable
    holder = make_request("holder", range(1, 9))
    compute(manager, holder, 8)  # 2 blocks
    request = make_request("big", range(1, 10))  # 9 tokens: 3 blocks, 1 free
    assert manager.allocate_slots(request, 9) is None
    assert manager.get_num_free_blocks() == 1
    manager.free(request)  # freeing a refused request is harmless
    manager.free(holder)
    assert manager.get_num_free_blocks() == 3


def test_a_cached_prefix_is_found_and_shared():
    manager = make_manager()
    first = make_request("first", range(1, 11))  # blocks [1-4] [5-8] full, [9-10] partial
    compute(manager, first, 10)
    manager.free(first)
    free = manager.get_num_free_blocks()
    second = make_request("second", [*range(1, 9), 50, 51, 52])  # same first 8 tokens
    hits, num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 8
    compute(manager, second, 3, hits, num_hit_tokens)
    assert manager.get_num_free_blocks() == free - 3  # two hit blocks taken back, one new
    manager.free(second)
    assert manager.get_num_free_blocks() == manager.num_usable_blocks


def test_hits_stop_one_token_short_of_the_whole_prompt():
    """A prompt entirely cached still computes its last token, so the step has logits to sample from."""
    manager = make_manager()
    first = make_request("first", range(1, 9))  # exactly two full blocks
    compute(manager, first, 8)
    manager.free(first)
    again = make_request("again", range(1, 9))
    _, num_hit_tokens = manager.get_computed_blocks(again)
    assert num_hit_tokens == 4  # (8 - 1) // 4 blocks


def test_a_different_salt_or_no_caching_finds_nothing():
    manager = make_manager()
    first = make_request("first", range(1, 11))
    compute(manager, first, 10)
    manager.free(first)
    salted = make_request("salted", range(1, 11))
    salted.cache_salt = "tenant-b"
    assert manager.get_computed_blocks(salted)[1] == 0
    plain = make_manager(caching=False)
    other = make_request("other", range(1, 11))
    compute(plain, other, 10)
    plain.free(other)
    assert plain.get_computed_blocks(make_request("again", range(1, 11)))[1] == 0


def test_a_held_prefix_is_shared_by_two_running_requests():
    manager = make_manager()
    first = make_request("first", range(1, 11))
    compute(manager, first, 10)
    second = make_request("second", range(1, 11))
    hits, num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 8
    before = manager.get_num_free_blocks()
    compute(manager, second, 2, hits, num_hit_tokens)
    assert manager.get_num_free_blocks() == before - 1  # only the partial last block is new
    manager.free(first)
    manager.free(second)
    assert manager.get_num_free_blocks() == manager.num_usable_blocks


def test_prefix_cache_stats_count_tokens_and_reset():
    manager = make_manager()
    first = make_request("first", range(1, 11))
    manager.get_computed_blocks(first)
    compute(manager, first, 10)
    manager.free(first)
    manager.get_computed_blocks(make_request("second", range(1, 11)))
    assert manager.take_prefix_cache_stats() == (20, 8)
    assert manager.take_prefix_cache_stats() == (0, 0)


def test_reset_prefix_cache_waits_for_every_block_to_be_free():
    manager = make_manager()
    first = make_request("first", range(1, 11))
    compute(manager, first, 10)
    assert manager.reset_prefix_cache() is False
    manager.free(first)
    assert manager.reset_prefix_cache() is True
    assert manager.get_computed_blocks(make_request("again", range(1, 11)))[1] == 0
