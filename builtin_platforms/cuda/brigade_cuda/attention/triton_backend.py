"""The Triton paged-attention backend for CUDA GPUs: KV write, split-KV decode and varlen prefill
(book ch. 6 for the backend contract, ch. 10 for CUDA-graph constraints).

A step's requests arrive decodes first (``metadata.num_decodes`` requests of one query token each),
then prefills. ``forward`` launches at most four kernels: the KV-cache write, the decode split kernel
and its merge, and the prefill kernel. It never reads device memory on the host (no ``.item()``, no
``.tolist()``); only the host integers of the metadata size the grids.

CUDA-graph capture of decode steps: capture with a fixed number of decode requests and set
``decode_num_splits`` to a fixed value (otherwise it is chosen per step from ``max_seq_len``, which
changes the grid); pad ``slot_mapping`` with -1 and ``seq_lens`` with 0 for padding requests, whose
output rows are then zeros.
"""

from __future__ import annotations

import torch

from brigade.attention.backend import AttentionBackend, AttentionMetadata
from brigade_cuda.attention.decode import choose_num_splits, decode_attention
from brigade_cuda.attention.kv_write import write_kv_cache
from brigade_cuda.attention.prefill import prefill_attention


class TritonAttentionBackend(AttentionBackend):
    """Paged attention through Triton kernels on CUDA devices.

    Invariant: reads and writes the same KV layout as the reference backend,
    ``[2, num_blocks, block_size, num_kv_heads, head_size]``, so the two are interchangeable per layer.
    """

    name = "triton"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    supported_block_sizes = (16, 32, 64, 128)
    supported_head_sizes = (64, 80, 96, 128, 256)
    supported_devices = ("cuda",)
    supports_cuda_graphs = True

    def __init__(self, num_heads: int, head_size: int, num_kv_heads: int, scale: float,
                 decode_num_splits: int | None = None):
        """Args as the base class; ``decode_num_splits`` pins the decode split count (for CUDA graphs).

        Raises:
            ValueError: when num_heads is not a multiple of num_kv_heads.
        """
        super().__init__(num_heads, head_size, num_kv_heads, scale)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.decode_num_splits = decode_num_splits
        self._num_sms: dict[int, int] = {}  # device index -> multiprocessor count, read once per device

    def _multiprocessors(self, device: torch.device) -> int:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._num_sms:
            self._num_sms[index] = torch.cuda.get_device_properties(index).multi_processor_count
        return self._num_sms[index]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """See ``AttentionBackend.forward``; query/key/value must have a contiguous last dimension."""
        num_tokens = metadata.num_actual_tokens
        write_kv_cache(key[:num_tokens], value[:num_tokens], kv_cache, metadata.slot_mapping[:num_tokens])
        if query.stride(-1) != 1:
            query = query.contiguous()
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        num_decodes = metadata.num_decodes
        if num_decodes:
            num_splits = self.decode_num_splits or choose_num_splits(
                num_decodes, self.num_kv_heads, metadata.max_seq_len, self._multiprocessors(query.device))
            decode_attention(query, kv_cache, metadata.block_table, metadata.seq_lens, out,
                             num_decodes=num_decodes, num_splits=num_splits, scale=self.scale)
        num_prefills = metadata.num_reqs - num_decodes
        if num_prefills:
            prefill_attention(query, kv_cache, metadata.block_table, metadata.seq_lens,
                              metadata.query_start_loc, out, first_req=num_decodes,
                              num_prefills=num_prefills, max_query_len=metadata.max_query_len,
                              scale=self.scale)
        return out
