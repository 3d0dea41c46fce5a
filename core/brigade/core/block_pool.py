"""BlockPool: the fixed set of KV blocks, their free queue in eviction order, and the prefix-cache index.

Blocks live for the whole engine; only their ``ref_cnt`` and ``block_hash`` change.
A block whose ``ref_cnt`` drops to 0 goes to the tail of the free queue but keeps its hash, so a later
request with the same prefix can take it back ("touch") until it is evicted from the head.
"""

from __future__ import annotations

from collections.abc import Iterable

from brigade.config import ConfigError
from brigade.core.block_hash import BlockHash

# A prefix-cache key: a block's chained hash and the KV cache group that computed it (vLLM's
# BlockHashWithGroupId). Groups share the hashes of a request's tokens but not their blocks: a full-attention
# block and a sliding-window block of the same tokens hold different layers' KV.
BlockKey = tuple[BlockHash, int]


class KVCacheBlock:
    """One block of KV slots. Also a node of the free queue's intrusive linked list."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "is_null")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockKey | None = None  # set while the block is in the prefix cache
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt})"


class FreeBlockQueue:
    """Doubly linked list of free blocks: evict from the head, return freed blocks to the tail.

    It links the blocks themselves (intrusive), so pushing, popping and removing from the middle (a prefix
    hit on a free block) are O(1) and allocate no Python objects.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]):
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        """Remove and return the least recently freed block. Raises ValueError when empty."""
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free KV blocks")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block from anywhere in the queue."""
        assert block.prev_free is not None and block.next_free is not None, f"{block} is not free"
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail (evicted last)."""
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def block_ids(self) -> list[int]:
        """Free block ids from head to tail (for tests)."""
        ids, node = [], self._head.next_free
        while node is not None and node is not self._tail:
            ids.append(node.block_id)
            node = node.next_free
        return ids


class BlockPool:
    """All KV blocks of the engine. Block 0 is the null block: never allocated, used as padding.

    Invariant: a block is in the free queue exactly when its ref_cnt is 0 (the null block excepted), and
    ``cached`` maps a (hash, group id) key to at most one block carrying that key. One pool serves every KV
    cache group; a block id belongs to one group at a time.
    """

    def __init__(self, num_blocks: int, enable_caching: bool):
        if num_blocks < 2:
            raise ConfigError(f"the KV cache needs at least 2 blocks, got {num_blocks}; give it more memory")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[BlockKey, KVCacheBlock] = {}

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def get_num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        """Fraction of usable blocks held by requests, in [0, 1]."""
        return 1.0 - self.get_num_free_blocks() / self.num_usable_blocks

    def get_cached_block(self, block_hash: BlockHash, group_id: int = 0) -> KVCacheBlock | None:
        """The block of KV cache group ``group_id`` cached under ``block_hash``, or None."""
        return self.cached.get((block_hash, group_id))

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take blocks from the head of the free queue, evicting their cached hashes.

        Raises ValueError when fewer than num_blocks are free (callers check first).
        """
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"asked for {num_blocks} KV blocks, {self.get_num_free_blocks()} free")
        out = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            self._maybe_evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _maybe_evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits, pulling free ones out of the free queue. The null block (a
        sliding-window table's entry for tokens out of the window) is shared by all and never counted."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash, group_id: int = 0) -> None:
        """Record a full block of group ``group_id`` under its hash so later requests can hit it. A key already
        cached keeps its block; the null block is never cached."""
        if not self.enable_caching or block.block_hash is not None or block.is_null:
            return
        key = (block_hash, group_id)
        if key in self.cached:
            return
        block.block_hash = key
        self.cached[key] = block

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue's tail in this order. The null
        block is skipped."""
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"double free of {block}"
            if block.ref_cnt == 0:
                if not self.enable_caching:
                    block.block_hash = None
                self.free_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Only allowed when no request holds a block; returns whether it did."""
        if self.get_num_free_blocks() != self.num_usable_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True
