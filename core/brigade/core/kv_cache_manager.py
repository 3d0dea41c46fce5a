"""KVCacheManager: per-request block tables on top of the BlockPool, and prefix-cache lookups.

The scheduler asks it two questions: how many of a new request's tokens are already in the cache
(``get_computed_blocks``), and whether a request can get slots for N more tokens (``allocate_slots``).
It never touches tensors; the model runner receives block ids through the SchedulerOutput.
"""

from __future__ import annotations

from collections.abc import Sequence

from brigade.core.block_hash import BlockHasher
from brigade.core.block_pool import BlockPool, KVCacheBlock
from brigade.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Maps each running request to its ordered list of blocks (its block table).

    Invariant: a request holding blocks has ``len(blocks) * block_size >= num_computed_tokens``; blocks
    return to the pool through ``free`` when it finishes, aborts or is preempted.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, hash_algo: str = "sha256"):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.hasher = BlockHasher(hash_algo)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks of a request already hashed
        self.prefix_cache_queries = 0  # tokens looked up since the last take_prefix_cache_stats()
        self.prefix_cache_hits = 0

    # ---- prefix cache ---------------------------------------------------------------------------
    def _update_block_hashes(self, request: Request) -> None:
        if self.enable_caching:
            self.hasher.extend_hashes(request.block_hashes, request.all_token_ids, self.block_size,
                                      request.lora_key, request.cache_salt)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a request that holds no blocks.

        At most ``num_tokens - 1`` tokens count as hits, so at least one token is computed and the step
        yields logits to sample from.

        Returns:
            (blocks, num_computed_tokens): the hit blocks (not yet referenced) and the tokens they cover.
        """
        if not self.enable_caching:
            return [], 0
        self._update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    def take_prefix_cache_stats(self) -> tuple[int, int]:
        """(queries, hits) in tokens since the last call."""
        stats = (self.prefix_cache_queries, self.prefix_cache_hits)
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        return stats

    # ---- allocation -----------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVCacheBlock] = (),
                       num_new_computed_tokens: int = 0, num_external_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request``.

        The block table then covers, in order (vLLM's layout)::

            | computed | new_computed (local hits) | external (a KV connector loads them) | new (computed) |

        Args:
            request: a running request, or a waiting one being admitted.
            num_new_tokens: tokens to compute this step.
            new_computed_blocks: prefix-cache hits from get_computed_blocks (waiting requests only).
            num_new_computed_tokens: tokens those hits cover.
            num_external_tokens: tokens after the hits whose KV a connector loads before this step's forward
                pass (waiting requests only); they get fresh blocks, published to the prefix cache like
                computed ones, since their KV is in place once the step runs.
        Returns:
            The newly allocated blocks (possibly empty), or None when the pool cannot hold them; in that
            case nothing changes.
        """
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_external_tokens + num_new_tokens
        num_needed = cdiv(total_tokens, self.block_size) - len(blocks) - len(new_computed_blocks)
        # Hits that sit in the free queue stop being free once touched.
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_needed + num_evictable_hits > self.pool.get_num_free_blocks():
            if not blocks:
                del self.req_to_blocks[request.request_id]
            return None
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_blocks[request.request_id] = len(blocks)
        new_blocks = self.pool.get_new_blocks(num_needed) if num_needed > 0 else []
        blocks.extend(new_blocks)
        self._cache_full_blocks(request, blocks, min(total_tokens, request.num_tokens))
        return new_blocks

    def _cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        """Publish the hashes of blocks that are full once this step's tokens are written."""
        if not self.enable_caching:
            return
        num_full = num_tokens // self.block_size
        start = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        self._update_block_hashes(request)
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], request.block_hashes[i])
        self.num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Return every block of a request. Tail blocks are freed first, so they are evicted first."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    # ---- state ----------------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return self.pool.usage()

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
