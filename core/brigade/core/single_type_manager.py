"""Per-group block managers: the block table of each request in one KV cache group (vLLM v1's
``SingleTypeKVCacheManager``).

Every group draws from the one ``BlockPool``. What differs by the group's attention type is which blocks a request
still needs and what a prefix-cache hit must contain:

- full attention (``FullAttentionManager``): every block until the request finishes; a hit is a prefix of cached
  blocks.
- sliding window (``SlidingWindowManager``): only the blocks covering the window of the next token; blocks that fall
  out of it are freed while the request runs (replaced by the pool's null block in its table), and a hit needs only
  the blocks of the ``sliding_window - 1`` tokens before the hit point.
"""

from __future__ import annotations

from collections.abc import Sequence

from brigade.core.block_hash import BlockHash
from brigade.core.block_pool import BlockPool, KVCacheBlock
from brigade.interfaces.kv_cache_spec import KVCacheSpec, SlidingWindowSpec, cdiv


class SingleTypeManager:
    """The block lists of one KV cache group, request by request.

    Invariant: ``req_to_blocks[r][i]`` holds tokens ``[i * block_size, (i + 1) * block_size)`` of request ``r``
    (or is the null block where they are no longer needed); the first ``num_cached_blocks[r]`` of them were offered
    to the prefix cache.
    """

    # A hit's prefix is a hit too (full attention); a sliding-window hit cut shorter must be looked up again.
    prefix_closed = True

    def __init__(self, pool: BlockPool, group_id: int, block_size: int):
        self.pool = pool
        self.group_id = group_id
        self.block_size = block_size
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}

    # ---- prefix cache ---------------------------------------------------------------------------
    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_num_blocks: int) -> list[KVCacheBlock]:
        """The hit blocks of the longest cached prefix of at most ``max_num_blocks`` blocks (not referenced yet);
        the list's length is the hit in blocks. Entries may be the null block where the group needs no KV."""
        raise NotImplementedError

    # ---- allocation -----------------------------------------------------------------------------
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks no later token of the request reads (none for full attention)."""

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock]
                               ) -> int:
        """Free blocks it takes to cover ``num_tokens`` tokens after taking ``new_computed_blocks``: new blocks plus
        hits that sit in the free queue (touching takes them out of it)."""
        held = len(self.req_to_blocks.get(request_id, ()))
        num_new = max(cdiv(num_tokens, self.block_size) - held - len(new_computed_blocks), 0)
        return num_new + sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)

    def save_new_computed_blocks(self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on a waiting request's hit blocks and append them to its table (already cached)."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_blocks[request_id] = len(blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Append fresh blocks until the table covers ``num_tokens`` tokens; returns them (the caller checked the
        pool has enough)."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        new_blocks = self.pool.get_new_blocks(num_new)
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash], num_tokens: int) -> None:
        """Publish the blocks that are full once ``num_tokens`` tokens are written (``block_hashes`` covers them)."""
        num_full = num_tokens // self.block_size
        start = self.num_cached_blocks.get(request_id, 0)
        if num_full <= start:
            return
        blocks = self.req_to_blocks[request_id]
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], block_hashes[i], self.group_id)
        self.num_cached_blocks[request_id] = num_full

    def free(self, request_id: str) -> None:
        """Return every block of a request; tail blocks first, so they are evicted first."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_blocks.pop(request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks the request holds in this group (null entries excluded)."""
        return sum(1 for b in self.req_to_blocks.get(request_id, ()) if not b.is_null)


class FullAttentionManager(SingleTypeManager):
    """Full attention: a request keeps every block; a hit is the longest prefix of cached blocks."""

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_num_blocks: int) -> list[KVCacheBlock]:
        hits: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_num_blocks]:
            block = self.pool.get_cached_block(block_hash, self.group_id)
            if block is None:
                break
            hits.append(block)
        return hits


class SlidingWindowManager(SingleTypeManager):
    """Sliding window: token ``p`` reads positions ``[p - sliding_window + 1, p]`` only (vLLM's
    ``SlidingWindowManager``).

    Blocks whose tokens all precede the window of the next token to compute are freed while the request runs and
    replaced by the null block, so the runner's block table keeps the stale id (the kernel never reads it).
    """

    prefix_closed = False

    def __init__(self, pool: BlockPool, group_id: int, block_size: int, sliding_window: int):
        super().__init__(pool, group_id, block_size)
        self.sliding_window = sliding_window
        # Blocks a hit must end with: those of the sliding_window - 1 tokens before the hit point.
        self.num_window_blocks = cdiv(sliding_window - 1, block_size)

    def find_longest_cache_hit(self, block_hashes: Sequence[BlockHash], max_num_blocks: int) -> list[KVCacheBlock]:
        """Scan from the right for ``num_window_blocks`` contiguous cached blocks; the hit ends at the first such
        run found (its leading blocks are the null block). Without such a run, the cached prefix from block 0."""
        max_num_blocks = min(max_num_blocks, len(block_hashes))
        if self.num_window_blocks == 0:
            return [self.pool.null_block] * max_num_blocks
        hits = [self.pool.null_block] * max_num_blocks
        num_contiguous = 0
        for i in range(max_num_blocks - 1, -1, -1):
            block = self.pool.get_cached_block(block_hashes[i], self.group_id)
            if block is None:
                num_contiguous = 0
                continue
            hits[i] = block
            num_contiguous += 1
            if num_contiguous >= self.num_window_blocks:
                return hits[:i + num_contiguous]
        return hits[:num_contiguous]  # the run that reached block 0 (or none)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks whose tokens all come before ``num_computed_tokens - sliding_window + 1``, the first
        position the next token reads. Walks back from the last such block and stops at a null one: those before
        it were freed by an earlier call."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        first_useful_block = max(num_computed_tokens - self.sliding_window + 1, 0) // self.block_size
        removed = []
        for i in range(min(first_useful_block, len(blocks)) - 1, -1, -1):
            if blocks[i].is_null:
                break
            removed.append(blocks[i])
            blocks[i] = self.pool.null_block
        self.pool.free_blocks(removed)


def make_group_manager(spec: KVCacheSpec, pool: BlockPool, group_id: int) -> SingleTypeManager:
    """The manager of a group by its spec's type: sliding window, else full attention."""
    if isinstance(spec, SlidingWindowSpec):
        return SlidingWindowManager(pool, group_id, spec.block_size, spec.sliding_window)
    return FullAttentionManager(pool, group_id, spec.block_size)
