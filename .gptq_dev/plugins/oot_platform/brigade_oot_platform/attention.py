"""OotAttentionBackend: the example vendor's attention backend (the reference math under its own name)."""

from __future__ import annotations

from brigade.attention.reference import ReferenceAttentionBackend


class OotAttentionBackend(ReferenceAttentionBackend):
    """Paged attention for the oot device. A real vendor calls its kernels in ``forward``; the KV cache
    layout ``[2, num_blocks, block_size, num_kv_heads, head_size]`` is the core's contract."""

    name = "oot"
    supported_devices = ("cpu",)
