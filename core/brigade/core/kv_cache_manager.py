"""KVCacheManager: per-request block tables of every KV cache group on one BlockPool, and prefix-cache lookups.

The scheduler asks it two questions: how many of a new request's tokens are already in the cache
(``get_computed_blocks``), and whether a request can get slots for N more tokens (``allocate_slots``).
With several KV cache groups (a hybrid model: full-attention and sliding-window layers) it coordinates one
``SingleTypeManager`` per group, as vLLM v1's ``HybridKVCacheCoordinator`` does: an allocation succeeds in every
group or in none, and a prefix hit is the longest one valid in every group.
It never touches tensors; the model runner receives block ids through the SchedulerOutput, one list per group.
"""

from __future__ import annotations

from collections.abc import Sequence

from brigade.core.block_hash import BlockHasher
from brigade.core.block_pool import BlockPool, KVCacheBlock
from brigade.core.request import Request
from brigade.core.single_type_manager import FullAttentionManager, SingleTypeManager, make_group_manager
from brigade.interfaces.kv_cache_spec import KVCacheSpec

# Per KV cache group (the order of KVCacheConfig.groups): a request's blocks, or block ids.
GroupBlocks = tuple[list[KVCacheBlock], ...]
GroupBlockIds = tuple[list[int], ...]


class KVCacheManager:
    """Maps each running request to one ordered block list (block table) per KV cache group.

    Invariant: a request holding blocks has, in every group, a table covering its ``num_computed_tokens``
    (sliding-window tables hold the null block for tokens out of the window); its blocks return to the pool
    through ``free`` when it finishes, aborts or is preempted.

    Args:
        num_blocks: blocks in the pool, the null block included.
        block_size: tokens per block (every group's).
        enable_caching: automatic prefix caching.
        hash_algo: the prefix-cache hash (``BlockHasher``).
        specs: one spec per KV cache group, in group order (``KVCacheConfig.groups``); None: one full-attention
            group.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, hash_algo: str = "sha256",
                 specs: Sequence[KVCacheSpec] | None = None):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.hasher = BlockHasher(hash_algo)
        if specs is None:
            self.managers: list[SingleTypeManager] = [FullAttentionManager(self.pool, 0, block_size)]
        else:
            if any(spec.block_size != block_size for spec in specs):
                raise ValueError(f"every KV cache group must use blocks of {block_size} tokens")
            self.managers = [make_group_manager(spec, self.pool, g) for g, spec in enumerate(specs)]
        self.prefix_cache_queries = 0  # tokens looked up since the last take_prefix_cache_stats()
        self.prefix_cache_hits = 0

    @property
    def num_groups(self) -> int:
        return len(self.managers)

    # ---- prefix cache ---------------------------------------------------------------------------
    def _update_block_hashes(self, request: Request) -> None:
        if self.enable_caching:
            self.hasher.extend_hashes(request.block_hashes, request.all_token_ids, self.block_size,
                                      request.lora_key, request.cache_salt)

    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks | None, int]:
        """Longest cached prefix of a request that holds no blocks, valid in every group.

        At most ``num_tokens - 1`` tokens count as hits, so at least one token is computed and the step
        yields logits to sample from. The hit length starts at that cap; each group's longest hit within it may
        shorten it, a full-attention hit is then cut, a sliding-window one looked up again, until every group
        agrees (vLLM's rule for hybrid models).

        Returns:
            (blocks, num_computed_tokens): per group, the hit blocks (not yet referenced; sliding-window ones lead
            with the null block), or None without caching; and the tokens they cover.
        """
        if not self.enable_caching:
            return None, 0
        self._update_block_hashes(request)
        hashes = request.block_hashes
        num_hit = (request.num_tokens - 1) // self.block_size  # in blocks
        hits: list[list[KVCacheBlock] | None] = [None] * len(self.managers)
        while True:
            for g, manager in enumerate(self.managers):
                found = hits[g]
                if found is not None and len(found) == num_hit:
                    continue
                if found is not None and manager.prefix_closed:
                    hits[g] = found[:num_hit]
                    continue
                hits[g] = manager.find_longest_cache_hit(hashes, num_hit)
                num_hit = min(num_hit, len(hits[g]))
            if all(len(found) == num_hit for found in hits):
                break
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_hit * self.block_size
        return tuple(hits), num_hit * self.block_size

    def take_prefix_cache_stats(self) -> tuple[int, int]:
        """(queries, hits) in tokens since the last call."""
        stats = (self.prefix_cache_queries, self.prefix_cache_hits)
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        return stats

    # ---- allocation -----------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int, new_computed_blocks: GroupBlocks | None = None,
                       num_new_computed_tokens: int = 0, num_external_tokens: int = 0) -> GroupBlockIds | None:
        """Make room for ``num_new_tokens`` more tokens of ``request`` in every group, or in none.

        Each group's table then covers, in order (vLLM's layout)::

            | computed | new_computed (local hits) | external (a KV connector loads them) | new (computed) |

        First, sliding-window groups free the blocks that fell out of the window of the request's next token
        (``remove_skipped_blocks`` at ``num_computed_tokens``), as vLLM does at the start of ``allocate_slots``.

        Args:
            request: a running request, or a waiting one being admitted.
            num_new_tokens: tokens to compute this step.
            new_computed_blocks: prefix-cache hits from get_computed_blocks, per group (waiting requests only).
            num_new_computed_tokens: tokens those hits cover.
            num_external_tokens: tokens after the hits whose KV a connector loads before this step's forward
                pass (waiting requests only); they get fresh blocks, published to the prefix cache like
                computed ones, since their KV is in place once the step runs.
        Returns:
            The ids of the newly allocated blocks per group (lists possibly empty), or None when the pool cannot
            hold them; in that case no group took a block.
        """
        rid = request.request_id
        total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_external_tokens + num_new_tokens
        hits = new_computed_blocks or ((),) * len(self.managers)
        for manager in self.managers:
            manager.remove_skipped_blocks(rid, request.num_computed_tokens)
        num_needed = sum(m.num_blocks_to_allocate(rid, total_tokens, hit) for m, hit in zip(self.managers, hits))
        if num_needed > self.pool.get_num_free_blocks():
            return None
        new_ids = []
        for manager, hit in zip(self.managers, hits):
            manager.save_new_computed_blocks(rid, hit)
            new_ids.append([b.block_id for b in manager.allocate_new_blocks(rid, total_tokens)])
        if self.enable_caching:
            num_tokens = min(total_tokens, request.num_tokens)  # drafts are never cached
            if num_tokens >= self.block_size:
                self._update_block_hashes(request)
            for manager in self.managers:
                manager.cache_blocks(rid, request.block_hashes, num_tokens)
        return tuple(new_ids)

    def free(self, request: Request) -> None:
        """Return every block of a request, in every group."""
        for manager in self.managers:
            manager.free(request.request_id)

    def get_block_ids(self, request_id: str) -> GroupBlockIds:
        """The request's block table per group (the null block's id 0 where a sliding window dropped one)."""
        return tuple(manager.block_ids(request_id) for manager in self.managers)

    def num_held_blocks(self, request_id: str) -> list[int]:
        """Blocks the request holds per group (null entries excluded)."""
        return [manager.num_held_blocks(request_id) for manager in self.managers]

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
