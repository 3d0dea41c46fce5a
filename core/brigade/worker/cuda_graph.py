"""Decode CUDA graphs: capture the forward pass at fixed batch sizes, replay with padded batches.

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
from brigade.worker.input_batch import HostToDevice, StepInputs, align_up, group_key, layer_metadata, packed_offsets

logger = logging.getLogger(__name__)


def default_capture_sizes(max_num_seqs: int, level: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, then every 8 up to max_num_seqs (-O3: every 8 up to 512)."""
    limit = max(max_num_seqs, 512) if level >= 3 else max_num_seqs
    sizes = [s for s in (1, 2, 4) if s <= limit] + list(range(8, limit + 1, 8))
    if limit not in sizes:
        sizes.append(limit)
    return sorted(set(sizes))


class GraphInputs:
    """The persistent input buffers CUDA graphs read: token rows (input ids, positions, slot mapping, logits
    indices, then each further KV cache group's slot mapping; int64) and request rows (seq_lens,
    query_start_loc, then a block table per KV cache group; int32).

    They live in one device byte buffer, mirrored by a pinned host buffer, so a step's inputs go in with one
    copy and a replay has nothing left to copy. Every array starts at a 64-byte boundary, as in
    ``HostToDevice`` (Triton specializes on alignment).
    """

    def __init__(self, max_tokens: int, max_reqs: int, max_blocks_per_req: int, device: torch.device,
                 num_groups: int = 1):
        """Buffers for up to ``max_tokens`` token rows and ``max_reqs`` requests of ``max_blocks_per_req``
        blocks in each of ``num_groups`` KV cache groups; slots start at -1 (write nothing), everything else
        at 0."""
        self.device = device
        self._row64 = align_up(max_tokens, HostToDevice.ALIGN_BYTES // 8)  # int64 elements per token array
        num_rows = 3 + num_groups
        offsets, end32 = packed_offsets([max_reqs, max_reqs + 1] + [max_reqs * max_blocks_per_req] * num_groups,
                                        HostToDevice.ALIGN_BYTES // 4)
        self.qsl_at, self._table_at = offsets[1], offsets[2:]
        self._bytes64, bytes32 = 8 * num_rows * self._row64, 4 * end32
        pin = device.type == "cuda"
        self._dev = torch.zeros(self._bytes64 + bytes32, dtype=torch.uint8, device=device)
        self._host = torch.zeros(self._bytes64 + bytes32, dtype=torch.uint8, pin_memory=pin)
        dev64, dev32 = self._dev[:self._bytes64].view(torch.int64), self._dev[self._bytes64:].view(torch.int32)
        self._host64 = self._host[:self._bytes64].view(torch.int64)
        self._host32 = self._host[self._bytes64:].view(torch.int32)
        self._copied = torch.cuda.Event() if pin else None  # guards the host buffers' reuse
        rows = dev64.view(num_rows, -1)[:, :max_tokens]
        self.input_ids, self.positions, self.slot_mapping, self.logits_indices = rows[:4]
        self.seq_lens = dev32[:max_reqs]
        self.query_start_loc = dev32[self.qsl_at:self.qsl_at + max_reqs + 1]
        table_len = max_reqs * max_blocks_per_req
        self.block_tables = [dev32[at:at + table_len].view(max_reqs, max_blocks_per_req) for at in self._table_at]
        self.block_table = self.block_tables[0]
        self.slot_mappings = [self.slot_mapping, *rows[4:]]  # per KV cache group
        for slots in self.slot_mappings:
            slots.fill_(-1)
        self.sync_host()

    def sync_host(self) -> None:
        """Make the host mirror equal the device buffers (after filling them on the device)."""
        self._host.copy_(self._dev)

    def host_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The host mirror as numpy views, once the previous step's copy out of it has run: the int64 token
        arrays [4, rows] (input ids, positions, slot mapping, logits indices), the int32 part (seq_lens at 0,
        query_start_loc at ``qsl_at``) and the block table [max_reqs, max_blocks_per_req]."""
        if self._copied is not None:
            self._copied.synchronize()
        h32 = self._host32.numpy()
        return (self._host64.numpy().reshape(-1, self._row64), h32,
                h32[self._table_at[0]:self._table_at[0] + self.block_table.numel()].reshape(self.block_table.shape))

    def fill_groups(self, arrays: dict[str, np.ndarray], num_reqs: int, num_tokens: int, padded_tokens: int
                    ) -> dict[str, torch.Tensor]:
        """Put the KV cache groups after the first's slot mappings (padded with -1 up to ``padded_tokens``) and
        block tables into the host mirror (``host_views`` first); returns their device views by ``group_key``
        name. Nothing to do with one group."""
        out: dict[str, torch.Tensor] = {}
        if len(self.block_tables) == 1:
            return out
        h64, h32 = self._host64.numpy().reshape(-1, self._row64), self._host32.numpy()
        for g in range(1, len(self.block_tables)):
            table = arrays[group_key("block_table", g)]
            width = table.shape[1]
            h64[3 + g, :num_tokens] = arrays[group_key("slot_mapping", g)]
            h64[3 + g, num_tokens:padded_tokens] = -1
            at = self._table_at[g]
            h32[at:at + self.block_table.numel()].reshape(self.block_table.shape)[:num_reqs, :width] = table
            out[group_key("block_table", g)] = self.block_tables[g][:num_reqs, :width]
            out[group_key("slot_mapping", g)] = self.slot_mappings[g][:num_tokens]
        return out

    def group_tensors(self, num_reqs: int, num_tokens: int) -> dict[str, torch.Tensor]:
        """The device buffers of the KV cache groups after the first, for a graph of ``num_reqs`` requests and
        ``num_tokens`` token rows, by ``group_key`` name."""
        out = {}
        for g in range(1, len(self.block_tables)):
            out[group_key("block_table", g)] = self.block_tables[g][:num_reqs]
            out[group_key("slot_mapping", g)] = self.slot_mappings[g][:num_tokens]
        return out

    def copy_to_device(self, num_reqs: int) -> None:
        """Start the host-to-device copy of every token row and the first ``num_reqs`` rows of the block tables
        (the rows of every table but the last go whole)."""
        used = self._bytes64 + 4 * (self._table_at[-1] + num_reqs * self.block_table.shape[1])
        self._dev[:used].copy_(self._host[:used], non_blocking=True)
        if self._copied is not None:
            self._copied.record()


class DecodeGraphs:
    """Captured decode graphs over persistent input buffers; one graph per batch size (and context bucket).

    A graph ends with the model's hidden states ([size * query_len, hidden], a few KB a row); the caller
    computes the logits of the rows it samples after the replay, so the graphs hold no ``[size, vocab]``
    logits buffer each: at 512 requests those would add up to ~4 GB of bf16 for Llama-3.1-8B's vocabulary (the
    sum of the captured sizes times 128,256 logits times 2 bytes), outside the KV budget.

    Each batch size is captured once per context-length bucket the attention backend asks for
    (``AttentionBackend.decode_graph_seq_lens``); a step replays the smallest bucket holding its longest
    context.

    Invariant: every graph reads ``input_ids``, ``positions`` and the metadata buffers at the same
    addresses; a step built through ``transfer`` has its inputs there, padded to the graph size, so ``run``
    only picks the graph and replays it.
    """

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], capture_sizes: list[int], *,
                 max_blocks_per_req: int, max_model_len: int, device: torch.device,
                 seq_len_buckets: Callable[[int, int], tuple[int, ...]] | None = None, query_len: int = 1,
                 layer_groups: list[int] | None = None):
        """``query_len`` > 1: graphs of speculative verification steps, every request with exactly that many
        query tokens (its last sampled token and its drafts, padded; ``build_step_inputs(uniform_query_len=)``),
        attended as prefill chunks over the cached context, with a logits row for every token.
        ``layer_groups``: per layer, its KV cache group when the model has several (each group gets its own
        persistent block table and slot mapping); None: one group."""
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(capture_sizes)
        self.max_size = self.sizes[-1]
        self.device = device
        self.max_model_len = max_model_len
        self.query_len = query_len
        self.num_replays = 0
        reqs = self.max_size
        self.layer_groups = layer_groups
        num_groups = 1 + max(layer_groups) if layer_groups else 1
        self.buffers = GraphInputs(reqs * query_len, reqs, max_blocks_per_req, device, num_groups)
        b = self.buffers
        self.input_ids, self.positions, self.slot_mapping, self.logits_indices = (
            b.input_ids, b.positions, b.slot_mapping, b.logits_indices)
        self.seq_lens, self.query_start_loc, self.block_table = b.seq_lens, b.query_start_loc, b.block_table
        self.query_start_loc.copy_(torch.arange(reqs + 1, dtype=torch.int32) * query_len)
        if query_len > 1:  # padding requests: a context of their own query tokens, in the null block
            self.seq_lens.fill_(query_len)
        b.sync_host()
        # Verification steps attend through the prefill kernel, which does not depend on max_seq_len.
        buckets = seq_len_buckets if seq_len_buckets is not None and query_len == 1 else \
            (lambda size, max_len: (max_len,))
        self.buckets = {size: sorted({min(b, max_model_len) for b in buckets(size, max_model_len)} | {max_model_len})
                        for size in self.sizes}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (batch size, seq-len bucket)
        self.hidden: dict[tuple[int, int], torch.Tensor] = {}  # each graph's output [size * query_len, hidden]

    def _metadata(self, size: int, max_seq_len: int) -> AttentionMetadata:
        q, tokens = self.query_len, size * self.query_len
        return AttentionMetadata(
            num_reqs=size, num_actual_tokens=tokens, max_query_len=q, max_seq_len=max_seq_len,
            num_decodes=size if q == 1 else 0, query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size], block_table=self.block_table[:size], slot_mapping=self.slot_mapping[:tokens],
            query_start_loc_cpu=torch.arange(size + 1, dtype=torch.int32) * q,
            seq_lens_cpu=torch.full((size,), q, dtype=torch.int32))

    def _forward(self, size: int, max_seq_len: int) -> torch.Tensor:
        tokens = size * self.query_len
        md = self._metadata(size, max_seq_len)
        per_layer = None
        if self.layer_groups:
            per_layer = layer_metadata(md, self.buffers.group_tensors(size, tokens), self.layer_groups)
        ctx = AttentionContext(metadata=md, kv_caches=self.kv_caches, layer_metadata=per_layer)
        return self.model(self.input_ids[:tokens], self.positions[:tokens], ctx)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (size, bucket), largest first, sharing one memory pool.

        The metadata's ``max_seq_len`` is the bucket while capturing, so a backend that picks its decode
        split count from it fixes one count per graph, valid for any context up to the bucket at replay.
        """
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            for bucket in reversed(self.buckets[size]):
                self._forward(size, bucket)  # warm up: Triton compiles and autotunes outside the capture
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.hidden[size, bucket] = self._forward(size, bucket)
                self.graphs[size, bucket] = graph
            # The LM head runs after the replay, outside the graph (a variant without programmatic dependent
            # launch, with the head's own tile): compile it for this many rows now, not under the first step of
            # this size while serving (the serve benchmark at the Llama-3.1-8B shape: one compile while serving
            # without this, none with it).
            self.model.compute_logits(self.hidden[size, self.buckets[size][-1]])
        torch.cuda.synchronize(self.device)
        logger.info("captured %d %s CUDA graphs (batch sizes %d..%d) in %.1f s, %.2f GiB", len(self.graphs),
                    "decode" if self.query_len == 1 else f"speculative verification ({self.query_len} tokens a "
                    "request)", self.sizes[0], self.max_size, time.perf_counter() - start,
                    (torch.cuda.memory_reserved(self.device) - reserved) / 2**30)

    def can_run(self, num_reqs: int, max_query_len: int) -> bool:
        """Whether a step of ``num_reqs`` requests, none with more than ``max_query_len`` query tokens, fits
        (decode graphs: exactly one token each; verification graphs: up to ``query_len``)."""
        fits = max_query_len == 1 if self.query_len == 1 else max_query_len <= self.query_len
        return fits and num_reqs <= self.max_size and bool(self.graphs)

    def size_for(self, num_reqs: int) -> int:
        """The captured batch size a step of ``num_reqs`` requests replays (the smallest that holds it)."""
        return self.sizes[bisect.bisect_left(self.sizes, num_reqs)]

    def transfer(self, arrays: dict[str, np.ndarray], min_size: int = 0) -> dict[str, torch.Tensor]:
        """A ``Transfer`` (``input_batch.build_step_inputs``) for a step that ``can_run``: the arrays go
        straight into the graphs' input buffers, padded to the graph size (slot -1, seq_len 0), in one
        host-to-device copy; the returned tensors are views of those buffers. ``min_size`` (a captured size):
        pad to at least that graph (lockstep data-parallel engines replay the same size; ``run`` gets it too).

        Raises:
            ValueError: when the step has more requests than the largest graph or wider block tables.
        """
        n, width = len(arrays["seq_lens"]), arrays["block_table"].shape[1]
        q, tokens = self.query_len, len(arrays["input_ids"])
        if n > self.max_size or width > self.block_table.shape[1] or tokens != n * q:
            raise ValueError(f"a step of {n} requests, {tokens} tokens and {width} blocks does not fit the "
                             f"CUDA graphs ({self.max_size} requests of {q} tokens, {self.block_table.shape[1]} "
                             "blocks)")
        size = max(self.size_for(n), min_size)
        b = self.buffers
        h64, h32, table = b.host_views()
        h64[0, :tokens] = arrays["input_ids"]
        h64[1, :tokens] = arrays["positions"]
        h64[1, tokens:size * q] = 0
        h64[2, :tokens] = arrays["slot_mapping"]
        h64[2, tokens:size * q] = -1
        num_logits = len(arrays["logits_indices"])
        h64[3, :num_logits] = arrays["logits_indices"]
        h32[:n] = arrays["seq_lens"]
        h32[n:size] = 0 if q == 1 else q
        h32[b.qsl_at:b.qsl_at + n + 1] = arrays["query_start_loc"]
        table[:n, :width] = arrays["block_table"]
        groups = b.fill_groups(arrays, n, tokens, size * q)
        b.copy_to_device(size)  # rows past the graph size: never read
        return {"input_ids": self.input_ids[:tokens], "positions": self.positions[:tokens],
                "slot_mapping": self.slot_mapping[:tokens], "logits_indices": self.logits_indices[:num_logits],
                "query_start_loc": self.query_start_loc[:n + 1], "seq_lens": self.seq_lens[:n],
                "block_table": self.block_table[:n, :width], **groups}

    def run_padding(self, size: int) -> None:
        """Replay the graph of ``size`` requests (a captured size) on padding rows only: token 0 at position 0,
        slot -1 (nothing written), ``seq_len`` 0 (``query_len`` for verification graphs), the smallest context
        bucket; the output is not read. A lockstep data-parallel engine's dummy batch when the others replay
        this size (``GraphDispatch.agree_across_dp``)."""
        q = self.query_len
        h64, h32, _ = self.buffers.host_views()
        h64[:2, :size * q] = 0
        h64[2, :size * q] = -1
        h64[4:, :size * q] = -1  # the other KV cache groups' slots
        h32[:size] = 0 if q == 1 else q
        self.buffers.copy_to_device(size)
        self.graphs[size, self.buckets[size][0]].replay()
        self.num_replays += 1

    def run(self, inputs: StepInputs, min_size: int = 0) -> torch.Tensor:
        """Replay the smallest graph that fits a step built through ``transfer`` (at least ``min_size``, as
        ``transfer`` padded it); returns the hidden states [num_logits, hidden] of the rows
        ``inputs.logits_indices`` names, in that order (the rows to compute logits for; a view of the graph's
        output, valid until the next replay).

        Raises:
            ValueError: when the step's inputs are not in the graph buffers (built through another transfer).
        """
        if inputs.input_ids.data_ptr() != self.input_ids.data_ptr():
            raise ValueError("DecodeGraphs.run needs a step built with transfer=DecodeGraphs.transfer")
        md = inputs.metadata
        n = md.num_reqs
        size = max(self.size_for(n), min_size)
        buckets = self.buckets[size]
        bucket = buckets[bisect.bisect_left(buckets, md.max_seq_len)]
        self.graphs[size, bucket].replay()
        self.num_replays += 1
        hidden = self.hidden[size, bucket][:n * self.query_len]  # a row per token row
        if self.query_len == 1 and len(inputs.sampling_req_ids) == n:  # every row samples, in order
            return hidden
        return hidden[inputs.logits_indices]
