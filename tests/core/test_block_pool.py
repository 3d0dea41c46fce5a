"""BlockPool and its free queue: eviction order, touch, caching and reset."""

import pytest

from brigade.core.block_hash import BlockHasher
from brigade.core.block_pool import BlockPool


def test_free_queue_is_lru_and_null_block_is_reserved():
    pool = BlockPool(6, enable_caching=True)
    assert pool.get_num_free_blocks() == 5
    a = pool.get_new_blocks(3)
    assert [b.block_id for b in a] == [1, 2, 3]
    pool.free_blocks(reversed(a))  # tail block first, so it is evicted first
    assert pool.free_queue.block_ids() == [4, 5, 3, 2, 1]
    assert all(b.block_id != 0 for b in pool.get_new_blocks(5))
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_touch_takes_free_cached_block_out_of_the_queue_and_eviction_drops_hash():
    pool = BlockPool(4, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.cache_block(block, b"h1")
    pool.free_blocks([block])
    assert pool.get_cached_block(b"h1") is block and pool.get_num_free_blocks() == 3
    pool.touch([block])
    assert block.ref_cnt == 1 and pool.get_num_free_blocks() == 2
    pool.free_blocks([block])
    # Allocating everything evicts the cached block and forgets its hash.
    pool.get_new_blocks(3)
    assert pool.get_cached_block(b"h1") is None and block.block_hash is None


def test_reset_prefix_cache_only_when_all_blocks_free():
    pool = BlockPool(4, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.cache_block(block, b"h")
    assert pool.reset_prefix_cache() is False
    pool.free_blocks([block])
    assert pool.reset_prefix_cache() is True and pool.get_cached_block(b"h") is None


def test_double_free_is_caught():
    pool = BlockPool(4, enable_caching=False)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    with pytest.raises(AssertionError):
        pool.free_blocks([block])


def test_chained_hashes_depend_on_parent_and_salt():
    hasher = BlockHasher("sha256")
    a, b = [], []
    hasher.extend_hashes(a, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    hasher.extend_hashes(b, [9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a[1] != b[1], "same block tokens under a different parent must hash differently"
    salted = []
    hasher.extend_hashes(salted, [1, 2, 3, 4, 5, 6, 7, 8], 4, cache_salt="tenant-b")
    assert salted[0] != a[0] and salted[1] != a[1]


def test_none_hash_seed_is_random_per_hasher():
    # A predictable seed would let one tenant forge another's block hashes.
    assert BlockHasher("builtin").none_hash != BlockHasher("builtin").none_hash
    assert BlockHasher("sha256").none_hash != BlockHasher("sha256").none_hash
    with pytest.raises(ValueError):
        BlockHasher("md5")


# ---- the free queue on its own ----------------------------------------------------------------------------


def _queue(num_blocks: int):
    from brigade.core.block_pool import FreeBlockQueue, KVCacheBlock

    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    return FreeBlockQueue(blocks), blocks


def test_free_queue_pops_in_insertion_order_and_counts():
    queue, blocks = _queue(4)
    assert queue.block_ids() == [0, 1, 2, 3] and queue.num_free_blocks == 4
    assert queue.popleft() is blocks[0] and queue.popleft() is blocks[1]
    assert queue.block_ids() == [2, 3] and queue.num_free_blocks == 2


def test_free_queue_removes_from_the_middle_and_unlinks_the_block():
    queue, blocks = _queue(5)
    queue.remove(blocks[2])  # a prefix hit on a free block
    assert queue.block_ids() == [0, 1, 3, 4] and queue.num_free_blocks == 4
    assert blocks[2].prev_free is None and blocks[2].next_free is None
    queue.remove(blocks[0])
    queue.remove(blocks[4])  # both ends
    assert queue.block_ids() == [1, 3] and queue.popleft() is blocks[1]


def test_free_queue_appends_at_the_tail_and_refuses_to_pop_when_empty():
    queue, blocks = _queue(2)
    first = queue.popleft()
    queue.append(first)  # freed again: evicted last
    assert queue.block_ids() == [1, 0]
    queue.popleft()
    queue.popleft()
    assert queue.num_free_blocks == 0 and queue.block_ids() == []
    with pytest.raises(ValueError, match="no free KV blocks"):
        queue.popleft()


def test_free_queue_refuses_to_remove_a_block_that_is_not_in_it():
    queue, blocks = _queue(3)
    queue.remove(blocks[1])
    with pytest.raises(AssertionError):
        queue.remove(blocks[1])


# ---- the pool's counts and invariants ---------------------------------------------------------------------


def test_pool_needs_two_blocks_and_reserves_the_null_block():
    from brigade.config import ConfigError

    with pytest.raises(ConfigError, match="at least 2 blocks"):
        BlockPool(1, enable_caching=False)
    pool = BlockPool(2, enable_caching=False)
    assert pool.num_usable_blocks == 1 and pool.null_block.is_null and pool.null_block.block_id == 0
    assert [b.block_id for b in pool.get_new_blocks(1)] == [1]


def test_pool_usage_follows_held_blocks():
    pool = BlockPool(5, enable_caching=False)  # 4 usable
    assert pool.usage() == 0.0
    held = pool.get_new_blocks(3)
    assert pool.usage() == pytest.approx(0.75) and all(b.ref_cnt == 1 for b in held)
    pool.free_blocks(held)
    assert pool.usage() == 0.0 and pool.get_num_free_blocks() == 4


def test_pool_refuses_more_blocks_than_free_and_takes_none():
    pool = BlockPool(4, enable_caching=False)
    with pytest.raises(ValueError):
        pool.get_new_blocks(4)
    assert pool.get_num_free_blocks() == 3  # nothing taken by the refused call


def test_a_shared_block_is_free_only_after_its_last_holder_frees_it():
    pool = BlockPool(4, enable_caching=True)
    (block,) = pool.get_new_blocks(1)
    pool.cache_block(block, b"shared")
    pool.touch([block])  # a second request hits it while the first still holds it
    assert block.ref_cnt == 2 and pool.get_num_free_blocks() == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and 1 not in pool.free_queue.block_ids()
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and pool.free_queue.block_ids()[-1] == block.block_id


def test_without_caching_a_freed_block_keeps_no_hash_and_is_never_hit():
    pool = BlockPool(4, enable_caching=False)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    assert pool.get_cached_block(b"anything") is None and block.block_hash is None


def test_one_hash_maps_to_one_block():
    pool = BlockPool(5, enable_caching=True)
    first, second = pool.get_new_blocks(2)
    pool.cache_block(first, b"h")
    pool.cache_block(second, b"h")  # the same content computed twice: the index keeps one
    assert pool.get_cached_block(b"h") in (first, second)
    assert sum(1 for b in (first, second) if pool.get_cached_block(b"h") is b) == 1
