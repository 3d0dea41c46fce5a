"""Block keys shared by KV connectors: a chained sha256 per full block of a request's tokens.

A block's key is the sha256 of its parent block's key and its token ids (int64, little-endian), the first block's
parent being a seed made of the engine's ``KVCacheLayout`` key and the request's ``cache_salt``: the prefix
cache's chaining, but with a fixed seed, so that two processes (a producer and a consumer) agree. A key thus names
the whole prefix up to its block, for one model, dtype and block layout; engines of another layout never find each
other's blocks.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence

from brigade.kv_transfer.base import KVCacheLayout

KEY_FORMAT = "brigade-kv-block/1"  # part of the seed: changing it changes every key


@functools.lru_cache(maxsize=16)
def layout_seed(layout: KVCacheLayout) -> bytes:
    """The 32-byte seed of ``layout``'s key chains: sha256 of ``KEY_FORMAT`` and ``layout.key()``."""
    return hashlib.sha256(f"{KEY_FORMAT}\0{layout.key()}".encode()).digest()


def extend_block_keys(keys: list[str], token_ids: Sequence[int], layout: KVCacheLayout,
                      cache_salt: str | None = None) -> None:
    """Append, in place, the keys of the full blocks of ``token_ids`` that ``keys`` does not hold yet.

    Args:
        keys: the keys of the first ``len(keys)`` blocks of ``token_ids`` (hex strings of 64 characters), as an
            earlier call left them; ``[]`` to start.
        token_ids: the request's tokens so far; a partial last block gets no key.
        layout: the engine's KV cache layout (seeds the chain).
        cache_salt: the request's ``cache_salt`` (seeds the chain too); None and "" are the same.
    """
    size = layout.block_size
    for i in range(len(keys), len(token_ids) // size):
        if i == 0:
            parent = hashlib.sha256(layout_seed(layout) + (cache_salt or "").encode()).digest()
        else:
            parent = bytes.fromhex(keys[i - 1])
        tokens = struct.pack(f"<{size}q", *token_ids[i * size:(i + 1) * size])
        keys.append(hashlib.sha256(parent + tokens).hexdigest())
