"""Chained block hashes for prefix caching.

The hash of block i covers block i's tokens, the hash of block i-1, and extra keys (the LoRA adapter's name
and id, and the ``cache_salt`` on the first block only). Chaining makes a hit on block i imply a hit on every
block before it, so a lookup walks from the start and stops at the first miss.

The parent of the first block is a seed. With Python's builtin (non-cryptographic) hash that seed must be
secret and random, or a tenant could craft prompts whose hashes collide with another tenant's blocks and
read or poison them; with sha256 a collision is infeasible, so the seed only separates processes.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Hashable, Sequence

BlockHash = bytes | int


class BlockHasher:
    """Computes the chained hash of each full block of a token sequence.

    Args:
        algo: "sha256" (default; a cryptographic hash of the pickled tuple) or "builtin" (Python's hash,
            faster, seeded with 8 random bytes per process).
    Raises:
        ValueError: for another algo name.
    """

    def __init__(self, algo: str = "sha256"):
        if algo not in ("sha256", "builtin"):
            raise ValueError(f"prefix caching hash {algo!r} is not known; use sha256 or builtin")
        self.algo = algo
        seed = os.urandom(32)
        self.none_hash: BlockHash = hashlib.sha256(seed).digest() if algo == "sha256" \
            else int.from_bytes(seed[:8], "little")

    def hash_block(self, parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple | None) -> BlockHash:
        """Hash one block given its parent's hash (None for the first block)."""
        key = (self.none_hash if parent is None else parent, tuple(token_ids), extra_keys)
        if self.algo == "sha256":
            return hashlib.sha256(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL)).digest()
        return hash(key)

    def extend_hashes(self, hashes: list[BlockHash], token_ids: Sequence[int], block_size: int,
                      lora_key: Hashable | None = None, cache_salt: str | None = None) -> None:
        """Append hashes for every full block of ``token_ids`` not yet in ``hashes`` (in place).

        ``lora_key``: the request's adapter (``Request.lora_key``: name and id), None for the base model.
        """
        num_full = len(token_ids) // block_size
        for i in range(len(hashes), num_full):
            extra: tuple | None = None
            if lora_key is not None or (i == 0 and cache_salt is not None):
                extra = (lora_key, cache_salt if i == 0 else None)
            parent = hashes[i - 1] if i > 0 else None
            hashes.append(self.hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra))
