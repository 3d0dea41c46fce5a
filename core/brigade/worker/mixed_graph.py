"""Mixed-step CUDA graphs: prefills, chunks, decodes and draft tokens in any mix, replayed at padded token counts
(vLLM's FULL CUDA-graph mode).

They read the same kind of persistent input buffers as the decode graphs (``cuda_graph.GraphInputs``).
"""

from __future__ import annotations

import bisect
import logging
import time

import numpy as np
import torch

from brigade.attention.backend import AttentionContext, AttentionMetadata
from brigade.worker.cuda_graph import GraphInputs
from brigade.worker.input_batch import StepInputs, layer_metadata

logger = logging.getLogger(__name__)


def default_mixed_sizes(max_num_batched_tokens: int, level: int) -> list[int]:
    """Token counts to capture mixed-step graphs for: every 8 up to 256, every 16 up to 512 (-O3: then every 32 up
    to 1024), none above the step budget. A step runs padded to the next size, and from ~256 tokens a step's
    GEMMs are compute-bound, so coarser sizes would cost what the padding adds. Above ~512 tokens a step's GPU
    work outlasts launching it from Python, so larger steps run eagerly (the timings behind both choices are in
    ``docs/performance-notes.md``)."""
    sizes = list(range(8, 257, 8)) + list(range(272, 513, 16)) + (list(range(544, 1025, 32)) if level >= 3 else [])
    return [n for n in sizes if n <= max_num_batched_tokens] or [8]


class MixedGraphs:
    """Full CUDA graphs of mixed steps: prefills, prefill chunks, decodes and draft tokens together, in any
    mix, one graph per padded token count (vLLM's FULL CUDA-graph mode).

    Decode graphs cover steps of one token per request; every other step launches each kernel from Python,
    and below a few hundred tokens that launching, not the GPU, sets the step time (a prompt arriving while
    others decode stalls them all for it). A step of ``n`` tokens and ``r`` requests replays the graph of the
    smallest captured token count ``T >= n``, captured for ``min(T, max_reqs)`` requests: padding requests have
    query length 0 and seq_len 0, padding token rows slot -1, and the attention backend reads every real length
    from the device (``AttentionMetadata.mixed_graph``; backends declare ``supports_mixed_cuda_graphs``). A graph
    ends with the model's hidden states; the caller computes the logits of the rows it samples (one GEMM, so
    the graphs hold no logits buffer each) and may score prompt tokens from the same hidden states.

    Invariant: as in ``DecodeGraphs``, every graph reads the same ``GraphInputs`` buffers, and ``run`` only
    picks the graph and replays it.
    """

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], token_sizes: list[int], *,
                 max_reqs: int, max_blocks_per_req: int, max_model_len: int, device: torch.device,
                 layer_groups: list[int] | None = None):
        """``max_reqs``: most requests in a step (max_num_seqs); ``layer_groups``: per layer, its KV cache group
        when the model has several (each group gets its own block table and slot mapping buffers)."""
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(token_sizes)
        self.max_tokens = self.sizes[-1]
        self.max_reqs = min(max_reqs, self.max_tokens)
        self.max_model_len = max_model_len
        self.device = device
        self.layer_groups = layer_groups
        self.buffers = GraphInputs(self.max_tokens, self.max_reqs, max_blocks_per_req, device,
                                   1 + max(layer_groups) if layer_groups else 1)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # token count -> graph
        self.hidden: dict[int, torch.Tensor] = {}  # token count -> [T, hidden_size], the graph's output
        self.num_replays = 0

    def reqs(self, size: int) -> int:
        """Requests in the graph of ``size`` tokens (every request has at least one token)."""
        return min(size, self.max_reqs)

    def size_for(self, num_tokens: int) -> int:
        """The captured token count a step of ``num_tokens`` tokens runs padded to."""
        return self.sizes[bisect.bisect_left(self.sizes, num_tokens)]

    def _metadata(self, size: int) -> AttentionMetadata:
        b, reqs = self.buffers, self.reqs(size)
        _, h32, _ = b.host_views()
        return AttentionMetadata(
            num_reqs=reqs, num_actual_tokens=size, max_query_len=size, max_seq_len=self.max_model_len,
            num_decodes=0, query_start_loc=b.query_start_loc[:reqs + 1], seq_lens=b.seq_lens[:reqs],
            block_table=b.block_table[:reqs], slot_mapping=b.slot_mapping[:size],
            query_start_loc_cpu=torch.from_numpy(h32[b.qsl_at:b.qsl_at + reqs + 1].copy()),
            seq_lens_cpu=torch.from_numpy(h32[:reqs].copy()), mixed_graph=True)

    def _forward(self, size: int) -> torch.Tensor:
        b = self.buffers
        md = self._metadata(size)
        per_layer = None
        if self.layer_groups:
            per_layer = layer_metadata(md, b.group_tensors(self.reqs(size), size), self.layer_groups)
        ctx = AttentionContext(metadata=md, kv_caches=self.kv_caches, layer_metadata=per_layer)
        return self.model(b.input_ids[:size], b.positions[:size], ctx)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every token count, largest first, sharing one memory pool (the buffers hold no request:
        every program of the attention kernels exits at once while warming up and capturing)."""
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            self._forward(size)  # warm up: Triton compiles and autotunes outside the capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.hidden[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        logger.info("captured %d mixed-step CUDA graphs (%d..%d tokens, up to %d requests) in %.1f s, %.2f GiB",
                    len(self.graphs), self.sizes[0], self.max_tokens, self.max_reqs, time.perf_counter() - start,
                    (torch.cuda.memory_reserved(self.device) - reserved) / 2**30)

    def can_run(self, num_tokens: int, num_reqs: int) -> bool:
        """Whether a step of ``num_tokens`` tokens and ``num_reqs`` requests fits."""
        return num_tokens <= self.max_tokens and num_reqs <= self.reqs(self.size_for(max(num_tokens, 1)))

    def transfer(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """A ``Transfer`` (``input_batch.build_step_inputs``) for a step that ``can_run``: the arrays go into
        the graphs' buffers padded to the graph's token and request counts, in one host-to-device copy.

        Raises:
            ValueError: when the step does not fit (``can_run``) or its block tables are wider than the buffers.
        """
        n, width = len(arrays["seq_lens"]), arrays["block_table"].shape[1]
        tokens, num_logits = len(arrays["input_ids"]), len(arrays["logits_indices"])
        b = self.buffers
        if not self.can_run(tokens, n) or width > b.block_table.shape[1]:
            raise ValueError(f"a step of {tokens} tokens, {n} requests and {width} blocks does not fit the "
                             f"mixed-step CUDA graphs ({self.max_tokens} tokens, {self.max_reqs} requests, "
                             f"{b.block_table.shape[1]} blocks)")
        size = self.size_for(tokens)
        reqs = self.reqs(size)
        h64, h32, table = b.host_views()
        h64[0, :tokens] = arrays["input_ids"]
        h64[0, tokens:size] = 0
        h64[1, :tokens] = arrays["positions"]
        h64[1, tokens:size] = 0
        h64[2, :tokens] = arrays["slot_mapping"]
        h64[2, tokens:size] = -1
        h64[3, :num_logits] = arrays["logits_indices"]  # read after the replay, not by the graph
        h32[:n] = arrays["seq_lens"]
        h32[n:reqs] = 0
        qsl = h32[b.qsl_at:b.qsl_at + reqs + 1]
        qsl[:n + 1] = arrays["query_start_loc"]
        qsl[n + 1:] = tokens
        table[:n, :width] = arrays["block_table"]
        groups = b.fill_groups(arrays, n, tokens, size)
        b.copy_to_device(n)  # padding requests' rows are never read (query length 0)
        return {"input_ids": b.input_ids[:tokens], "positions": b.positions[:tokens],
                "slot_mapping": b.slot_mapping[:tokens], "logits_indices": b.logits_indices[:num_logits],
                "query_start_loc": b.query_start_loc[:n + 1], "seq_lens": b.seq_lens[:n],
                "block_table": b.block_table[:n, :width], **groups}

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Replay the graph for a step built through ``transfer``; returns the hidden states [num_tokens,
        hidden_size] of the step's token rows (a view of the graph's output, valid until the next replay).

        Raises:
            ValueError: when the step's inputs are not in the graph buffers (built through another transfer).
        """
        if inputs.input_ids.data_ptr() != self.buffers.input_ids.data_ptr():
            raise ValueError("MixedGraphs.run needs a step built with transfer=MixedGraphs.transfer")
        num_tokens = len(inputs.input_ids)
        size = self.size_for(num_tokens)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.hidden[size][:num_tokens]

    def run_eager(self, inputs: StepInputs) -> torch.Tensor:
        """What ``run`` replays, run eagerly on the padded buffers (the padded layout checked where no graph
        can be captured, e.g. on the CPU in tests); same result as ``run``."""
        num_tokens = len(inputs.input_ids)
        with torch.inference_mode():
            return self._forward(self.size_for(num_tokens))[:num_tokens]
