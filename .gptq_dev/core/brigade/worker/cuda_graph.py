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

import numpy as np
import torch

from brigade.attention.backend import AttentionContext, AttentionMetadata
from brigade.worker.input_batch import HostToDevice, StepInputs, align_up, packed_offsets

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
    addresses; a step built through ``transfer`` has its inputs there, padded to the graph size, so ``run``
    only picks the graph and replays it.
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
        n, width = self.max_size, max_blocks_per_req
        # All graph inputs live in one device byte buffer (an int64 part, then an int32 part), mirrored by a
        # pinned host buffer, so ``transfer`` fills them with one copy and ``run`` has nothing left to copy.
        # Every array starts at a 64-byte boundary, as in ``HostToDevice`` (Triton specializes on alignment).
        self._row64 = align_up(n, HostToDevice.ALIGN_BYTES // 8)  # int64 elements per input row
        (_, self._qsl_at, self._table_at), end32 = packed_offsets([n, n + 1, n * width],
                                                                  HostToDevice.ALIGN_BYTES // 4)
        bytes64, bytes32 = 8 * 4 * self._row64, 4 * end32
        pin = device.type == "cuda"
        self._dev = torch.zeros(bytes64 + bytes32, dtype=torch.uint8, device=device)
        self._host = torch.zeros(bytes64 + bytes32, dtype=torch.uint8, pin_memory=pin)
        self._bytes64 = bytes64
        self._dev64, self._dev32 = self._dev[:bytes64].view(torch.int64), self._dev[bytes64:].view(torch.int32)
        self._host64, self._host32 = self._host[:bytes64].view(torch.int64), self._host[bytes64:].view(torch.int32)
        self._copied = torch.cuda.Event() if pin else None  # guards the host buffers' reuse
        self.input_ids, self.positions, self.slot_mapping, self.logits_indices = self._dev64.view(4, -1)[:, :n]
        self.seq_lens = self._dev32[:n]
        self.query_start_loc = self._dev32[self._qsl_at:self._qsl_at + n + 1]
        self.block_table = self._dev32[self._table_at:].view(n, width)
        self.slot_mapping.fill_(-1)
        self.query_start_loc.copy_(torch.arange(n + 1, dtype=torch.int32))
        self._host.copy_(self._dev)
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

    def transfer(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """A ``Transfer`` (``input_batch.build_step_inputs``) for a step that ``can_run``: the arrays go
        straight into the graphs' input buffers, padded to the graph size (slot -1, seq_len 0), in one
        host-to-device copy; the returned tensors are views of those buffers.

        Raises:
            ValueError: when the step has more requests than the largest graph or wider block tables.
        """
        n, width = len(arrays["seq_lens"]), arrays["block_table"].shape[1]
        if n > self.max_size or width > self.block_table.shape[1]:
            raise ValueError(f"a step of {n} requests and {width} blocks does not fit the decode graphs "
                             f"({self.max_size} requests, {self.block_table.shape[1]} blocks)")
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        num_logits, cap = len(arrays["logits_indices"]), self.max_size
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy has left the host buffers
        h64 = self._host64.numpy().reshape(4, self._row64)
        h64[0, :n] = arrays["input_ids"]
        h64[1, :n] = arrays["positions"]
        h64[2, :n] = arrays["slot_mapping"]
        h64[2, n:size] = -1
        h64[3, :num_logits] = arrays["logits_indices"]
        h32 = self._host32.numpy()
        h32[:n] = arrays["seq_lens"]
        h32[n:size] = 0
        h32[self._qsl_at:self._qsl_at + n + 1] = arrays["query_start_loc"]
        table = h32[self._table_at:].reshape(cap, -1)
        table[:n, :width] = arrays["block_table"]
        used = self._bytes64 + 4 * (self._table_at + size * table.shape[1])  # rows past the graph size: never read
        self._dev[:used].copy_(self._host[:used], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return {"input_ids": self.input_ids[:n], "positions": self.positions[:n],
                "slot_mapping": self.slot_mapping[:n], "logits_indices": self.logits_indices[:num_logits],
                "query_start_loc": self.query_start_loc[:n + 1], "seq_lens": self.seq_lens[:n],
                "block_table": self.block_table[:n, :width]}

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Replay the smallest graph that fits a pure-decode step built through ``transfer``; returns logits
        [num_reqs, vocab].

        Raises:
            ValueError: when the step's inputs are not in the graph buffers (built through another transfer).
        """
        if inputs.input_ids.data_ptr() != self.input_ids.data_ptr():
            raise ValueError("DecodeGraphs.run needs a step built with transfer=DecodeGraphs.transfer")
        md = inputs.metadata
        n = md.num_reqs
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        buckets = self.buckets[size]
        bucket = buckets[bisect.bisect_left(buckets, md.max_seq_len)]
        self.graphs[size, bucket].replay()
        return self.logits[size, bucket][:n]
