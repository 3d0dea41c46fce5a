"""KVBlockStore: KV blocks as files in one directory (by default under /dev/shm), one safetensors file per block.

A block's file is named by its chained key (``brigade.kv_transfer.extend_block_keys``, shared with the other
connectors): the sha256 of the parent block's key and the block's token ids, the first block's parent being a seed
made of the engine's ``KVCacheLayout`` key and the request's ``cache_salt`` (vLLM v1's chained block hash of the
prefix cache, but with a fixed seed, so that two processes agree). A key thus names the whole prefix up to its
block, for one model, dtype and block layout; engines of another layout never find each other's files. The file also
records the layout, the key and a CRC-32 of the data, checked on every read, so a truncated, corrupt or misplaced
file is refused (``StoreEntryError``) instead of loaded.

Writes are atomic: a temporary file in the same directory, then ``os.replace``. The files stay until removed:
this version evicts nothing (clear the directory, or mount a size-limited tmpfs).
"""

from __future__ import annotations

import logging
import os
import uuid
import zlib
from collections.abc import Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from brigade.kv_transfer import KVCacheLayout, extend_block_keys

logger = logging.getLogger(__name__)

FORMAT = "brigade-kv-block/1"
SUFFIX = ".safetensors"
TENSOR = "kv"  # [num_layers, *layout.block_shape]


class StoreEntryError(Exception):
    """A stored block that cannot be used: unreadable, truncated, corrupt, or of another layout or key."""


def _crc32(tensor: torch.Tensor) -> str:
    data = tensor.contiguous().view(torch.uint8).numpy()
    return f"{zlib.crc32(data):08x}"


class KVBlockStore:
    """The files of one layout's KV blocks under ``root``.

    Invariant: a file named ``<key>.safetensors`` that ``read`` accepts holds, for ``layout``, the KV of the
    prefix ``key`` names (its last block), as one tensor ``[num_layers, *block_shape]``.
    """

    def __init__(self, root: str, layout: KVCacheLayout):
        self.root = root
        self.layout = layout
        self.dtype = getattr(torch, layout.dtype)
        self.shape = (layout.num_layers, *layout.block_shape)

    # ---- keys -----------------------------------------------------------------------------------
    def extend_keys(self, keys: list[str], token_ids: Sequence[int], cache_salt: str | None = None) -> None:
        """Append the keys of the full blocks of ``token_ids`` not yet in ``keys`` (in place); hex strings."""
        extend_block_keys(keys, token_ids, self.layout, cache_salt)

    def path(self, key: str) -> str:
        return os.path.join(self.root, key + SUFFIX)

    def contains(self, key: str) -> bool:
        return os.path.isfile(self.path(key))

    # ---- blocks ---------------------------------------------------------------------------------
    def write(self, key: str, kv: torch.Tensor) -> bool:
        """Store one block ``kv`` ([num_layers, *block_shape], on the CPU) under ``key``, atomically. An
        existing file is left alone. Returns whether a file was written; an OS error is a WARNING, not raised."""
        path = self.path(key)
        if os.path.exists(path):
            return False
        kv = kv.contiguous()
        tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        metadata = {"format": FORMAT, "layout": self.layout.key(), "key": key, "crc32": _crc32(kv)}
        try:
            save_file({TENSOR: kv}, tmp, metadata=metadata)
            os.replace(tmp, path)
        except OSError as exc:
            logger.warning("KV store: cannot write %s (%s); later requests with this prefix will compute it", path,
                           exc)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            return False
        return True

    def read(self, key: str) -> torch.Tensor:
        """The block stored under ``key``: a CPU tensor [num_layers, *block_shape] of the layout's dtype.

        Raises:
            StoreEntryError: the file is missing, unreadable, truncated or corrupt (CRC-32), or holds another
                layout, key, dtype or shape; the message says which.
        """
        path = self.path(key)
        try:
            with safe_open(path, framework="pt") as f:
                metadata = f.metadata() or {}
                names = list(f.keys())
                kv = f.get_tensor(TENSOR) if names == [TENSOR] else None
        except FileNotFoundError:
            raise StoreEntryError("the file is gone") from None
        except Exception as exc:  # the file is untrusted input: any parse failure means "unusable"
            raise StoreEntryError(f"unreadable: {type(exc).__name__}: {exc}") from None
        if metadata.get("format") != FORMAT:
            raise StoreEntryError(f"format {metadata.get('format')!r}, expected {FORMAT!r}")
        if metadata.get("layout") != self.layout.key():
            raise StoreEntryError(f"made for another layout ({metadata.get('layout')!r}; this engine: "
                                  f"{self.layout.key()!r})")
        if metadata.get("key") != key:
            raise StoreEntryError("it records another block key")
        if kv is None:
            raise StoreEntryError(f"tensors {names}, expected [{TENSOR!r}]")
        if kv.dtype != self.dtype or tuple(kv.shape) != self.shape:
            raise StoreEntryError(f"tensor {kv.dtype} {tuple(kv.shape)}, expected {self.dtype} {self.shape}")
        if _crc32(kv) != metadata.get("crc32"):
            raise StoreEntryError("CRC-32 mismatch: the data is corrupt")
        return kv

    def discard(self, key: str) -> None:
        """Remove a block's file (an unusable one, so it is not tried again); a missing file is fine."""
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("KV store: cannot remove %s (%s)", self.path(key), exc)
