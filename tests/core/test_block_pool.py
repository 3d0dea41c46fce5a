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
