"""GraphDispatch: which CUDA graph, if any, runs a step, and the capture of every kind.

Three kinds of graph (``cuda_graph``): decode graphs (one token a request), speculative verification graphs
(1 + k tokens a request, padded) and mixed-step graphs (any mix of up to 512 tokens, cudagraph_mode FULL).
``plan`` picks the one a step replays; a step none fits runs eagerly.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from brigade.attention.backend import AttentionBackend
from brigade.config import BrigadeConfig
from brigade.distributed import get_dp_group
from brigade.plugins import current_platform
from brigade.worker.cuda_graph import DecodeGraphs, default_capture_sizes
from brigade.worker.input_batch import StepInputs
from brigade.worker.mixed_graph import MixedGraphs, default_mixed_sizes
from brigade.worker.request_states import StepBatch

logger = logging.getLogger(__name__)

SPEC_GRAPH_MAX_BATCH = 32  # speculative verification graphs are captured up to this many requests


@dataclass(slots=True)
class StepPlan:
    """How a step runs: ``graphs`` replays it (None: eagerly); ``uniform_query_len`` pads every request to that
    many query tokens (a verification step's layout, ``build_step_inputs(uniform_query_len=)``); ``min_size``
    (decode graphs of lockstep data-parallel engines): the captured size every engine replays this step, 0 when
    the step's own size is used."""

    graphs: DecodeGraphs | MixedGraphs | None = None
    uniform_query_len: int | None = None
    min_size: int = 0

    @property
    def transfer(self):
        """The ``Transfer`` that puts the step's inputs into ``graphs``' buffers (padded to ``min_size``)."""
        if self.min_size:
            return functools.partial(self.graphs.transfer, min_size=self.min_size)
        return self.graphs.transfer


class GraphDispatch:
    """The runner's captured graphs (``decode``, ``verify``, ``mixed``; None when not captured) and the choice
    of one per step."""

    def __init__(self, config: BrigadeConfig, attn_backend: type[AttentionBackend], device: torch.device):
        self.config = config
        self.attn_backend = attn_backend
        self.device = device
        max_len = config.model_config.max_model_len
        self.max_blocks_per_req = -(-max_len // config.cache_config.block_size)
        self.decode: DecodeGraphs | None = None
        self.verify: DecodeGraphs | None = None  # verification steps: 1 + k tokens a request
        self.mixed: MixedGraphs | None = None  # every other step of up to 512 tokens (cudagraph_mode FULL)
        self.layer_groups: list[int] | None = None  # per layer, its KV cache group (several groups only)

    def capture(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], *, lora: bool,
                layer_groups: list[int] | None = None) -> None:
        """Capture the graphs when the platform declares CUDA graphs (``Platform.supports_cuda_graphs``), the
        backend allows them and -O/--enforce-eager do (no verification graphs with LoRA). ``layer_groups``: per
        layer, its KV cache group when the model has several (``build_step_inputs``); None: one group."""
        self.layer_groups = layer_groups
        comp = self.config.compilation_config
        mode = comp.resolved_cudagraph_mode(bool(self.config.model_config.enforce_eager))
        graphs = current_platform().supports_cuda_graphs() and self.attn_backend.supports_cuda_graphs
        if not graphs or mode == "NONE":
            return
        max_seqs = self.config.scheduler_config.max_num_seqs
        sizes = comp.cudagraph_capture_sizes or default_capture_sizes(max_seqs, comp.level)
        max_len = self.config.model_config.max_model_len
        self.decode = DecodeGraphs(model, kv_caches, [s for s in sizes if s <= max(max_seqs, 1)],
                                   max_blocks_per_req=self.max_blocks_per_req, max_model_len=max_len,
                                   device=self.device, seq_len_buckets=self.attn_backend.decode_graph_seq_lens,
                                   layer_groups=layer_groups)
        self.decode.capture()
        if self.config.parallel_config.data_parallel_lockstep:
            logger.info("lockstep data-parallel engines: decode CUDA graphs only, each step replayed at one size by "
                        "every engine (agree_across_dp); other steps run eagerly")
            return
        spec = self.config.speculative_config
        if spec is not None and not lora:
            # Verification steps with a uniform 1 + k tokens a request (absent drafts padded), up to
            # SPEC_GRAPH_MAX_BATCH requests: eagerly, a step is bound by ~265 kernel launches from Python
            # (timings in docs/performance-notes.md).
            spec_sizes = [s for s in self.decode.sizes if s <= SPEC_GRAPH_MAX_BATCH]
            self.verify = DecodeGraphs(model, kv_caches, spec_sizes, max_blocks_per_req=self.max_blocks_per_req,
                                       max_model_len=max_len, device=self.device,
                                       query_len=1 + spec.num_speculative_tokens, layer_groups=layer_groups)
            self.verify.capture()
        if mode == "FULL" and self.attn_backend.supports_mixed_cuda_graphs:
            self.mixed = self.make_mixed_graphs(model, kv_caches)
            self.mixed.capture()

    def make_mixed_graphs(self, model: torch.nn.Module, kv_caches: list[torch.Tensor]) -> MixedGraphs:
        """The mixed-step graphs' buffers (``MixedGraphs``) for this configuration, not yet captured."""
        comp, sched = self.config.compilation_config, self.config.scheduler_config
        budget = sched.max_num_batched_tokens or 8192
        sizes = [n for n in (comp.mixed_capture_sizes or default_mixed_sizes(budget, comp.level)) if n <= budget]
        return MixedGraphs(model, kv_caches, sizes or [8], max_reqs=sched.max_num_seqs,
                           max_blocks_per_req=self.max_blocks_per_req,
                           max_model_len=self.config.model_config.max_model_len, device=self.device,
                           layer_groups=self.layer_groups)

    def plan(self, batch: StepBatch, *, lora: bool) -> StepPlan:
        """The graph a step replays: a decode graph for a pure-decode step that fits a captured size (it returns
        only the sampled rows' hidden states, so never with prompt logprobs), a verification graph for a step of
        decodes with drafts padded to 1 + k tokens, else a mixed-step graph when the step fits one; else none."""
        num_reqs, max_query = len(batch.req_ids), max(batch.num_scheduled)
        if (self.decode is not None and not batch.want_prompt_logprobs and batch.drafts is None
                and self.decode.can_run(num_reqs, max_query)):
            return StepPlan(self.decode)
        uniform = self.uniform_query_len(batch, lora=lora) if self.verify is not None else None
        if uniform is not None and self.verify.can_run(num_reqs, max_query):
            return StepPlan(self.verify, uniform)
        mixed = self.mixed_graphs_for_steps()
        longest = max(s.num_computed_tokens + n for s, n in zip(batch.states, batch.num_scheduled))
        limit = self.attn_backend.mixed_graph_max_context
        if mixed is not None and (limit is None or longest <= limit) and mixed.can_run(batch.num_tokens, num_reqs):
            return StepPlan(mixed)
        return StepPlan()

    def agree_across_dp(self, plan: StepPlan | None, num_reqs: int) -> StepPlan:
        """Lockstep data-parallel engines: the plan every engine follows this step. A replayed graph keeps the
        MoE dispatch size it was captured at (``moe_dispatch``), so either every engine replays a decode graph
        of the same size, the largest any engine needs (the others pad to it; an engine with nothing to run
        replays it on padding rows, ``DecodeGraphs.run_padding``), or, when any engine's step has no graph,
        every engine runs eagerly (and agrees on the dispatch size in the forward pass). One all-reduce MAX on
        the DP group's CPU group; every engine calls it once per forward pass, real or dummy, when graphs are
        captured (all engines capture them or none: same platform and settings).

        Args:
            plan: this engine's own plan (``plan``), or None for a dummy batch (it follows any size).
            num_reqs: the step's requests (0 for a dummy batch).
        """
        if self.decode is None:
            return plan if plan is not None else StepPlan()
        if plan is None:
            want = 0
        elif plan.graphs is self.decode:
            want = self.decode.size_for(num_reqs)
        else:
            want = -1  # eager
        eager, size = get_dp_group().max_over_group([int(want < 0), max(want, 0)])
        if eager:
            return StepPlan()
        return StepPlan(self.decode, min_size=size)

    def uniform_query_len(self, batch: StepBatch, *, lora: bool) -> int | None:
        """1 + k when a step with drafts can be padded to that many tokens a request: every request is a decode
        (its query is its last token and its drafts), the padding stays inside max_model_len, no prompt
        logprobs, no LoRA; else None."""
        if batch.drafts is None or batch.want_prompt_logprobs or lora:
            return None
        q = 1 + self.config.speculative_config.num_speculative_tokens
        if not all(n == 1 + len(d) and s.num_computed_tokens + 1 == s.num_tokens
                   for s, n, d in zip(batch.states, batch.num_scheduled, batch.drafts)):
            return None
        if max(s.num_computed_tokens for s in batch.states) + q > self.config.model_config.max_model_len:
            return None
        return q

    def mixed_graphs_for_steps(self) -> MixedGraphs | None:
        """The ``MixedGraphs`` steps may run through (the captured ones, or None)."""
        return self.mixed

    def replay(self, plan: StepPlan, inputs: StepInputs) -> torch.Tensor:
        """Replay ``plan.graphs`` for a step built through its ``transfer``: the hidden states of the logits rows
        (decode and verification graphs) or of every token row (mixed-step graphs)."""
        if plan.min_size:
            return plan.graphs.run(inputs, min_size=plan.min_size)
        return plan.graphs.run(inputs)
