"""Decode CUDA graphs: capture the forward pass at fixed batch sizes, replay with padded batches (book ch. 10).

A decode step launches hundreds of small kernels; replaying a captured graph turns them into one launch.
Graphs need fixed shapes and fixed addresses, so every input lives in a persistent buffer sized for the
largest batch, a step of ``n`` decodes is padded to the next captured size, and padding requests get
``seq_len`` 0 and slot -1 (nothing is written, their rows are ignored).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch

from brigade.attention.backend import AttentionContext, AttentionMetadata
from brigade.worker.input_batch import StepInputs

logger = logging.getLogger(__name__)


def default_capture_sizes(max_num_seqs: int, level: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, then every 8 up to max_num_seqs (-O3: every 8 up to 512)."""
    limit = max(max_num_seqs, 512) if level >= 3 else max_num_seqs
    sizes = [s for s in (1, 2, 4) if s <= limit] + list(range(8, limit + 1, 8))
    if limit not in sizes:
        sizes.append(limit)
    return sorted(set(sizes))


class DecodeGraphs:
    """Captured decode graphs over persistent input buffers; one graph (and logits buffer) per batch size.

    Each batch size is captured once per context-length bucket the attention backend asks for
    (``AttentionBackend.decode_graph_seq_lens``); a step replays the smallest bucket holding its longest
    context.

    Invariant: every graph reads ``input_ids``, ``positions`` and the metadata buffers at the same
    addresses; ``run`` writes a step's inputs there before replaying.
    """

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], capture_sizes: list[int], *,
                 max_blocks_per_req: int, max_model_len: int, device: torch.device,
                 seq_len_buckets: Callable[[int, int], tuple[int, ...]] | None = None):
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(capture_sizes)
        self.max_size = self.sizes[-1]
        self.device = device
        self.max_model_len = max_model_len
        n = self.max_size
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.block_table = torch.zeros((n, max_blocks_per_req), dtype=torch.int32, device=device)
        buckets = seq_len_buckets or (lambda size, max_len: (max_len,))
        self.buckets = {size: sorted({min(b, max_model_len) for b in buckets(size, max_model_len)} | {max_model_len})
                        for size in self.sizes}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (batch size, seq-len bucket)
        self.logits: dict[tuple[int, int], torch.Tensor] = {}

    def _metadata(self, size: int, max_seq_len: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_reqs=size, num_actual_tokens=size, max_query_len=1, max_seq_len=max_seq_len,
            num_decodes=size, query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
            block_table=self.block_table[:size], slot_mapping=self.slot_mapping[:size],
            query_start_loc_cpu=torch.arange(size + 1, dtype=torch.int32),
            seq_lens_cpu=torch.ones(size, dtype=torch.int32))

    def _forward(self, size: int, max_seq_len: int) -> torch.Tensor:
        ctx = AttentionContext(metadata=self._metadata(size, max_seq_len), kv_caches=self.kv_caches)
        hidden = self.model(self.input_ids[:size], self.positions[:size], ctx)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (size, bucket), largest first, sharing one memory pool.

        The metadata's ``max_seq_len`` is the bucket while capturing, so a backend that picks its decode
        split count from it fixes one count per graph, valid for any context up to the bucket at replay.
        """
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            for bucket in reversed(self.buckets[size]):
                self._forward(size, bucket)  # warm up: Triton compiles and autotunes outside the capture
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.logits[size, bucket] = self._forward(size, bucket)
                self.graphs[size, bucket] = graph
        torch.cuda.synchronize(self.device)
        logger.info("captured %d decode CUDA graphs (batch sizes %d..%d) in %.1f s", len(self.graphs),
                    self.sizes[0], self.max_size, time.perf_counter() - start)

    def can_run(self, num_reqs: int, max_query_len: int) -> bool:
        return max_query_len == 1 and num_reqs <= self.max_size and bool(self.graphs)

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Replay the smallest graph that fits a pure-decode step; returns logits [num_reqs, vocab]."""
        md = inputs.metadata
        n = md.num_reqs
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:n].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(md.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(md.seq_lens, non_blocking=True)
        width = md.block_table.shape[1]
        self.block_table[:n, :width].copy_(md.block_table, non_blocking=True)
        if size > n:
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].zero_()
        buckets = self.buckets[size]
        bucket = buckets[bisect.bisect_left(buckets, md.max_seq_len)]
        self.graphs[size, bucket].replay()
        return self.logits[size, bucket][:n]
