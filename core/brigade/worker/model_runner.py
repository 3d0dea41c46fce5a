"""ModelRunner: turns a SchedulerOutput into one forward pass and one sampling call.

It keeps its own copy of every scheduled request (token ids, block table, sampler state) and updates it
from the scheduler's diffs. It decides *how* to run the batch, never *who* runs.

With a KV connector (``--kv-transfer-config``) it holds the worker-role connector: before the forward pass the
connector loads what the step's ``kv_connector_metadata`` names into the KV cache, after it the connector saves.
A load that fails is recomputed in the same step (the request's loaded range joins its scheduled tokens), so
the scheduler's accounting holds and the outputs are those of an engine without connector.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.config import BrigadeConfig
from brigade.interfaces import KVConnectorMetadata, LogprobsLists, ModelRunnerOutput, RequestFailure, SchedulerOutput
from brigade.kv_transfer import KVCacheLayout, KVConnectorBase, KVConnectorRole, make_kv_connector
from brigade.plugins import current_platform, registries
from brigade.sample.metadata import SamplingRequestState, build_sampling_metadata
from brigade.sample.rejection_sampler import RejectionSampler
from brigade.sample.sampler import Sampler
from brigade.worker.cuda_graph import DecodeGraphs
from brigade.worker.input_batch import CachedRequestState, HostToDevice, build_step_inputs

logger = logging.getLogger(__name__)

SPEC_GRAPH_MAX_BATCH = 32  # speculative verification graphs are captured up to this many requests
PROMPT_LOGPROBS_ROWS = 256  # prompt positions scored per logits block ([rows, vocab] f32 at a time)


class ModelRunner:
    """Owns the model, the KV cache tensors, the sampler, and the runner-side request states."""

    def __init__(self, config: BrigadeConfig, device: torch.device, dtype: torch.dtype,
                 attn_backend: type[AttentionBackend], hf_config):
        self.config = config
        self.device = device
        self.dtype = dtype
        self.attn_backend = attn_backend
        self.hf_config = hf_config
        self.block_size = config.cache_config.block_size
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        # Logits processors from plugins (register_logits_processors); the Sampler skips built-ins it runs anyway.
        processors = registries.logits_processors
        classes = {n: processors.get(n) for n in processors.names()}
        self.sampler = Sampler(extra_logits_processors=list(classes.values()),
                               descriptions={cls: f"logits processor {n!r} from {processors.entry(n).source.describe()}"
                                             for n, cls in classes.items()})
        self.rejection_sampler = RejectionSampler(self.sampler)  # verifies draft tokens (speculative decoding)
        self.requests: dict[str, CachedRequestState] = {}
        self.transfer = HostToDevice(device)
        self.cuda_graphs = None  # DecodeGraphs once captured
        self.spec_graphs = None  # DecodeGraphs of speculative verification steps (1 + k tokens a request)
        self.mixed_graphs = None  # MixedGraphs: every other step of up to 512 tokens (cudagraph_mode FULL)
        # Run steps that would replay a mixed graph padded as the graph would, eagerly (tests: the padded
        # layout checked on the CPU, where no graph is captured).
        self.pad_mixed_steps = False
        self.pad_mixed_steps_graphs = None  # the uncaptured MixedGraphs those steps run through
        self.num_padded_mixed_steps = 0  # steps run in a mixed graph's padded layout (replayed or eagerly)
        # Pad verification steps to 1 + k tokens a request also when they run eagerly (tests: the padded layout
        # the verification graphs replay, checked on the CPU).
        self.pad_spec_steps = False
        self.num_padded_spec_steps = 0  # verification steps run padded (replayed or eagerly)
        self.prev_sampled: torch.Tensor | None = None  # [num_sampled] int64 on the device, last step's samples
        self.prev_rows: dict[str, int] = {}  # request id -> row of prev_sampled
        self.lora_manager = None  # brigade.lora.manager.LoRAManager with --enable-lora
        self.kv_connector: KVConnectorBase | None = None  # the worker-role KV connector (--kv-transfer-config)

    # ---- set-up ---------------------------------------------------------------------------------
    def load_model(self) -> None:
        from brigade.model_executor.loader import load_model

        lora_config = self.config.lora_config
        self.model = load_model(self.config.model_config, self.hf_config, dtype=self.dtype, device=self.device,
                                attn_backend=self.attn_backend, fold_norms=lora_config is None)
        self.vocab_size = self.hf_config.vocab_size
        if lora_config is not None:
            self._init_lora(lora_config)

    def _init_lora(self, lora_config) -> None:
        """Give the model's projections LoRA slots and load the --lora-modules adapters."""
        from brigade.lora.manager import LoRAManager
        from brigade.lora.request import lora_module_requests
        from brigade.worker.cuda_graph import default_capture_sizes

        sched, comp = self.config.scheduler_config, self.config.compilation_config
        graph_rows = max(comp.cudagraph_capture_sizes or default_capture_sizes(sched.max_num_seqs, 3))
        max_tokens = max(sched.max_num_batched_tokens or 8192, sched.max_num_seqs, graph_rows, 512)
        self.lora_manager = LoRAManager(self.model, self.hf_config, lora_config, max_num_tokens=max_tokens,
                                        device=self.device, dtype=self.dtype)
        for request in lora_module_requests(lora_config.lora_modules).values():
            self.lora_manager.add_adapter(request)

    def add_lora(self, lora_request) -> bool:
        """Register an adapter (a ``LoRARequest``) under its ``lora_int_id``; False when that id is taken.

        Raises:
            LoRAError: the adapter cannot be served, or LoRA is not enabled.
        """
        from brigade.lora.adapter import LoRAError

        if self.lora_manager is None:
            raise LoRAError(f"LoRA adapter {lora_request.lora_name!r}: LoRA is not enabled; start the engine "
                            "with enable_lora=True (--enable-lora)")
        return self.lora_manager.add_adapter(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop an adapter's weights and free its slot; False when no adapter has that id (or LoRA is off).
        The engine core calls it only once no unfinished request runs on the adapter."""
        return self.lora_manager is not None and self.lora_manager.remove_adapter(lora_int_id)

    def kv_cache_bytes_per_block(self, cache_dtype: torch.dtype | None = None) -> int:
        """Bytes one block takes across all layers (K and V)."""
        head_size, num_kv_heads, num_layers = self._kv_shape()
        shape = self.attn_backend.kv_cache_shape(1, self.block_size, num_kv_heads, head_size)
        numel = 1
        for d in shape:
            numel *= d
        elem = torch.empty((), dtype=cache_dtype or self.dtype).element_size()
        return numel * elem * num_layers

    def _kv_shape(self) -> tuple[int, int, int]:
        cfg = self.hf_config
        head_size = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return head_size, num_kv_heads, cfg.num_hidden_layers

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate one paged KV tensor per layer, laid out as the attention backend asks."""
        head_size, num_kv_heads, num_layers = self._kv_shape()
        shape = self.attn_backend.kv_cache_shape(num_blocks, self.block_size, num_kv_heads, head_size)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(num_layers)]
        if self.config.kv_transfer_config is not None:
            self.kv_connector = make_kv_connector(self.config.kv_transfer_config, KVConnectorRole.WORKER,
                                                  self.kv_cache_layout())
        self.maybe_capture_cuda_graphs(num_blocks)
        if self.device.type != "cpu":  # nothing is compiled on first use on the CPU
            self.warm_up_mixed_steps()
            self.warm_up_sampler()

    def shutdown(self) -> None:
        """Shut the worker-role KV connector down (its threads, sockets, registered memory); idempotent."""
        if self.kv_connector is not None:
            self.kv_connector.shutdown()

    def kv_cache_layout(self) -> KVCacheLayout:
        """The layout of this runner's KV blocks, for KV connectors: blocks are shared only between equal layouts.

        The model is named by its directory's real path (plus the quantization method, and the seed of dummy
        weights), the block dimension found by asking the attention backend for caches of 1 and 2 blocks.
        """
        head_size, num_kv_heads, num_layers = self._kv_shape()
        one = self.attn_backend.kv_cache_shape(1, self.block_size, num_kv_heads, head_size)
        two = self.attn_backend.kv_cache_shape(2, self.block_size, num_kv_heads, head_size)
        block_dim = next(i for i, (a, b) in enumerate(zip(one, two)) if a != b)
        mc = self.config.model_config
        model = os.path.realpath(mc.model)
        if mc.quantization:
            model += f"+{mc.quantization}"
        if mc.load_format == "dummy":
            model += f"+dummy(seed={mc.seed})"
        return KVCacheLayout(model=model, dtype=str(self.dtype).removeprefix("torch."), block_size=self.block_size,
                             num_layers=num_layers, block_shape=tuple(one[:block_dim]) + tuple(one[block_dim + 1:]),
                             block_dim=block_dim)

    @torch.inference_mode()
    def warm_up_mixed_steps(self) -> None:
        """Run two eager steps that mix a decode with a prefill (a 40-token context with a 3-token prompt, a
        300-token context with a 17-token prompt: one and several decode splits, a step small enough for the
        few-row GEMM kernels and one that is not), on a throwaway KV cache, so the kernels such steps use
        outside the CUDA graphs compile now and not under the first request that arrives while others decode
        (a Triton compile stalls every running request for about a second). The real KV cache is untouched."""
        max_len = self.config.model_config.max_model_len
        generator = torch.Generator().manual_seed(0)
        for context, prompt in sorted({(min(40, max_len - 2), 3), (min(300, max_len - 2), 17)}):
            if context < 1:
                continue
            prompt = min(prompt, max_len)
            self._dummy_step([(context + 1, context), (prompt, 0)], [1, prompt], generator)

    @torch.inference_mode()
    def warm_up_sampler(self) -> None:
        """Sample once from dummy logits per kind of plain batch (greedy, random, random with a temperature),
        so that a platform's fused sampler compiles its kernels now and not under the first requests (a
        compile stalls every running request; vLLM warms its sampler the same way)."""
        from brigade.sampling_params import SamplingParams

        logits = torch.randn(1, self.vocab_size, device=self.device).to(self.dtype)
        for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
                       SamplingParams(temperature=0.7)):
            state = SamplingRequestState(params=params, prompt_token_ids=[0], output_token_ids=[], generator=None,
                                         eos_token_id=None)
            self.sampler(logits, build_sampling_metadata([state], vocab_size=self.vocab_size, device=self.device))

    def maybe_capture_cuda_graphs(self, num_blocks: int) -> None:
        """Capture decode graphs on a CUDA device when the backend allows it and -O/--enforce-eager do."""
        comp = self.config.compilation_config
        mode = comp.resolved_cudagraph_mode(bool(self.config.model_config.enforce_eager))
        graphs = current_platform().supports_cuda_graphs() and self.attn_backend.supports_cuda_graphs
        if not graphs or mode == "NONE":
            return
        from brigade.worker.cuda_graph import default_capture_sizes

        max_seqs = self.config.scheduler_config.max_num_seqs
        sizes = comp.cudagraph_capture_sizes or default_capture_sizes(max_seqs, comp.level)
        max_len = self.config.model_config.max_model_len
        max_blocks = -(-max_len // self.block_size)
        self.cuda_graphs = DecodeGraphs(self.model, self.kv_caches, [s for s in sizes if s <= max(max_seqs, 1)],
                                        max_blocks_per_req=max_blocks, max_model_len=max_len, device=self.device,
                                        seq_len_buckets=self.attn_backend.decode_graph_seq_lens)
        self.cuda_graphs.capture()
        spec = self.config.speculative_config
        if spec is not None and self.lora_manager is None:
            # Verification steps with a uniform 1 + k tokens a request (absent drafts padded), up to
            # SPEC_GRAPH_MAX_BATCH requests: eagerly, a step is bound by ~265 kernel launches from Python
            # (12.3 ms at batch 1 on the H200 against 5.1 ms replayed; docs/benchmarks.md).
            spec_sizes = [s for s in self.cuda_graphs.sizes if s <= SPEC_GRAPH_MAX_BATCH]
            self.spec_graphs = DecodeGraphs(self.model, self.kv_caches, spec_sizes,
                                            max_blocks_per_req=max_blocks, max_model_len=max_len, device=self.device,
                                            query_len=1 + spec.num_speculative_tokens)
            self.spec_graphs.capture()
        if mode == "FULL" and self.attn_backend.supports_mixed_cuda_graphs:
            self.mixed_graphs = self._mixed_graphs(max_blocks)
            self.mixed_graphs.capture()

    def _mixed_step_graphs(self):
        """The captured ``MixedGraphs``, or with ``pad_mixed_steps`` an uncaptured one run eagerly; else None."""
        if self.mixed_graphs is not None or not self.pad_mixed_steps:
            return self.mixed_graphs
        if self.pad_mixed_steps_graphs is None:
            max_len = self.config.model_config.max_model_len
            self.pad_mixed_steps_graphs = self._mixed_graphs(-(-max_len // self.block_size))
        return self.pad_mixed_steps_graphs

    def _mixed_graphs(self, max_blocks_per_req: int):
        """The mixed-step graphs' buffers (``MixedGraphs``) for this configuration, not yet captured."""
        from brigade.worker.cuda_graph import MixedGraphs, default_mixed_sizes

        comp, sched = self.config.compilation_config, self.config.scheduler_config
        budget = sched.max_num_batched_tokens or 8192
        sizes = [n for n in (comp.mixed_capture_sizes or default_mixed_sizes(budget, comp.level)) if n <= budget]
        return MixedGraphs(self.model, self.kv_caches, sizes or [8], max_reqs=sched.max_num_seqs,
                           max_blocks_per_req=max_blocks_per_req, max_model_len=self.config.model_config.max_model_len,
                           device=self.device)

    # ---- one step -------------------------------------------------------------------------------
    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
            self.requests.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            token_ids = list(new.token_ids)
            sampling = SamplingRequestState(params=params, prompt_token_ids=token_ids[:new.num_prompt_tokens],
                                            output_token_ids=token_ids[new.num_prompt_tokens:],
                                            generator=generator, eos_token_id=new.eos_token_id)
            self.requests[new.req_id] = CachedRequestState(
                req_id=new.req_id, token_ids=token_ids, num_prompt_tokens=new.num_prompt_tokens,
                block_ids=list(new.block_ids), num_computed_tokens=new.num_computed_tokens, sampling=sampling,
                lora_int_id=new.lora_int_id)
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                    cached.num_computed_tokens):
            state = self.requests[req_id]
            state.block_ids.extend(new_blocks)
            state.num_computed_tokens = num_computed

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput, *,
                      overlap: bool = False) -> ModelRunnerOutput | SampledTokens | ReadyOutput:
        """Run the scheduled tokens through the model and sample for requests that reach their end.

        With ``overlap`` it returns as soon as the work is queued on the device: a SampledTokens whose
        ``get()`` waits for the tokens (a ReadyOutput when the step samples nothing). The next step may then be prepared and launched first; its inputs
        take those tokens straight from the device (vLLM v1's asynchronous scheduling).

        A scheduled request on a LoRA adapter whose evicted host weights cannot be read again is left out of
        the step and named in the output's ``failures`` (not run: the scheduler aborts it); the others run.
        """
        self._update_states(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput.make_empty()
        num_scheduled = scheduler_output.num_scheduled_tokens
        connector_meta = scheduler_output.kv_connector_metadata if self.kv_connector is not None else None
        if connector_meta is not None:
            num_scheduled = self._load_kv(connector_meta, num_scheduled)
        failed = self._lora_failures(num_scheduled) if self.lora_manager is not None else {}
        if failed:
            num_scheduled = {rid: n for rid, n in num_scheduled.items() if rid not in failed}
            if not num_scheduled:
                output = ModelRunnerOutput([], [], failures=failed)
                return ReadyOutput(output) if overlap else output
        result = self._run(scheduler_output, num_scheduled, connector_meta, overlap)
        if failed:
            (result.output if isinstance(result, ReadyOutput) else result).failures.update(failed)
        return result

    def _lora_failures(self, num_scheduled: dict[str, int]) -> dict[str, RequestFailure]:
        """The scheduled requests whose LoRA adapter cannot run (its evicted host weights cannot be read
        again; ``LoRAManager.maybe_reload``, which reads the others back): request id -> the LoRAError line,
        as a failure that did not run."""
        failed = self.lora_manager.maybe_reload(self.requests[rid].lora_int_id for rid in num_scheduled)
        if not failed:
            return {}
        return {rid: RequestFailure(failed[self.requests[rid].lora_int_id], ran=False) for rid in num_scheduled
                if self.requests[rid].lora_int_id in failed}

    def _run(self, scheduler_output: SchedulerOutput, num_scheduled: dict[str, int],
             connector_meta: KVConnectorMetadata | None,
             overlap: bool) -> ModelRunnerOutput | SampledTokens | ReadyOutput:
        """``execute_model`` for the requests of ``num_scheduled`` (the scheduler's, less those left out)."""
        # Decodes first: the attention metadata splits the batch by one count.
        order = sorted(num_scheduled, key=lambda rid: num_scheduled[rid] != 1)
        states = [self.requests[rid] for rid in order]
        want_prompt_logprobs = any(s.sampling.params.prompt_logprobs is not None
                                   and s.num_computed_tokens < s.num_prompt_tokens - 1 for s in states)
        # Draft tokens (speculative decoding) per request in batch order; such a request runs 1 + k tokens, so
        # its step never replays a decode graph (those take one token per request: can_run checks the
        # largest query).
        spec = scheduler_output.scheduled_spec_decode_tokens
        drafts = [spec.get(rid, []) for rid in order] if spec else None
        # A pure-decode step that fits a captured size replays a graph (which returns only the sampled rows'
        # hidden states); its inputs go straight into the graph's buffers.
        use_graph = (not want_prompt_logprobs and not spec and self.cuda_graphs is not None
                     and self.cuda_graphs.can_run(len(order), max(num_scheduled.values())))
        # A step of decodes with drafts can be padded to a uniform 1 + k tokens a request (and then replay a
        # verification graph) when every request is a decode (its query is its last token and its drafts) and
        # the padding stays inside max_model_len.
        uniform = None
        if (spec and not want_prompt_logprobs and self.lora_manager is None
                and (self.spec_graphs is not None or self.pad_spec_steps)):
            q = 1 + self.config.speculative_config.num_speculative_tokens
            if (all(num_scheduled[rid] == 1 + len(d) and s.num_computed_tokens + 1 == s.num_tokens
                    for rid, s, d in zip(order, states, drafts))
                    and max(s.num_computed_tokens for s in states) + q <= self.config.model_config.max_model_len):
                uniform = q
        graphs = self.cuda_graphs if use_graph else None
        if uniform is not None and self.spec_graphs is not None \
                and self.spec_graphs.can_run(len(order), max(num_scheduled.values())):
            graphs = self.spec_graphs
        elif not self.pad_spec_steps:
            uniform = None  # runs eagerly as scheduled, or in a mixed graph
        if graphs is None and uniform is None:
            mixed = self._mixed_step_graphs()
            longest = max(s.num_computed_tokens + num_scheduled[rid] for rid, s in zip(order, states))
            limit = self.attn_backend.mixed_graph_max_context
            if mixed is not None and (limit is None or longest <= limit) \
                    and mixed.can_run(sum(num_scheduled.values()), len(order)):
                graphs = mixed
                self.num_padded_mixed_steps += 1
        if self.lora_manager is not None:  # slots and token mask for this step (persistent buffers: graph-safe)
            self.lora_manager.set_batch([s.lora_int_id for s in states], [num_scheduled[rid] for rid in order])
        inputs = build_step_inputs(states, [num_scheduled[rid] for rid in order], block_size=self.block_size,
                                   device=self.device, transfer=self.transfer if graphs is None else graphs.transfer,
                                   spec_token_ids=drafts, uniform_query_len=uniform)
        if uniform is not None:
            self.num_padded_spec_steps += 1
        self._fill_pending_inputs(inputs)
        logits, hidden = self._forward(inputs, graphs=graphs, keep_hidden=want_prompt_logprobs)
        if connector_meta is not None:
            self.kv_connector.save_kv(connector_meta, self.kv_caches)
        prompt_logprobs = self._prompt_logprobs(order, inputs, hidden) if want_prompt_logprobs else {}
        for rid, n in num_scheduled.items():
            self.requests[rid].num_computed_tokens += n
        if not inputs.sampling_req_ids:  # only prompt chunks that do not reach their end: nothing to sample
            output = ModelRunnerOutput(req_ids=order, sampled_token_ids=[[] for _ in order],
                                       prompt_logprobs=prompt_logprobs)
            return ReadyOutput(output) if overlap else output
        if spec:
            output = self._verify_drafts(scheduler_output, order, inputs.sampling_req_ids, logits)
            output.prompt_logprobs = prompt_logprobs
            return output
        rows = [self.requests[rid].sampling for rid in inputs.sampling_req_ids]
        metadata = build_sampling_metadata(rows, vocab_size=logits.shape[-1], device=self.device)
        metadata.grammar_bitmask = self._grammar_bitmask(scheduler_output, inputs.sampling_req_ids)
        out = self.sampler(logits, metadata)
        self.prev_sampled = out.sampled_token_ids
        self.prev_rows = {rid: row for row, rid in enumerate(inputs.sampling_req_ids)}
        for rid in inputs.sampling_req_ids:
            self.requests[rid].num_pending += 1
        result = SampledTokens(self, order, inputs.sampling_req_ids, out)
        # Rows a plugin's logits processor failed on: their requests fail with its line (the engine goes on).
        result.failures = {inputs.sampling_req_ids[row]: RequestFailure(why, ran=True)
                           for row, why in metadata.processor_errors.items()}
        if overlap:
            return result  # requests with prompt_logprobs are never overlapped (Request.overlap_safe)
        output = result.get()
        output.prompt_logprobs = prompt_logprobs
        return output

    def _load_kv(self, metadata: KVConnectorMetadata, num_scheduled: dict[str, int]) -> dict[str, int]:
        """Have the KV connector load this step's blocks; returns the tokens to compute per request: the
        scheduler's, plus, for a request whose load failed, its loaded range (computed instead of loaded; its
        ``num_computed_tokens`` goes back to where that range began)."""
        self.kv_connector.start_load_kv(metadata, self.kv_caches)
        failed = self.kv_connector.wait_for_load()
        if not failed:
            return num_scheduled
        num_scheduled = dict(num_scheduled)
        for rid, num_valid in failed.items():
            state = self.requests.get(rid)
            if state is None or rid not in num_scheduled or not 0 <= num_valid < state.num_computed_tokens:
                continue
            num_scheduled[rid] += state.num_computed_tokens - num_valid
            state.num_computed_tokens = num_valid
        return num_scheduled

    def _verify_drafts(self, scheduler_output: SchedulerOutput, order: list[str], sampling_req_ids: list[str],
                       logits: torch.Tensor) -> ModelRunnerOutput:
        """Speculative decoding: verify the drafts with the rejection sampler and emit each sampling request's
        accepted drafts plus one token. ``logits`` holds 1 + k rows per request with k drafts
        (``build_step_inputs``), one per other sampling request. The runner's copies get the emitted tokens
        and roll ``num_computed_tokens`` back over the rejected drafts, as the scheduler does.

        Never overlapped: the scheduler needs the accepted tokens to propose the next drafts."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        rows: list[SamplingRequestState] = []
        row_req_ids: list[str] = []
        drafts_per_req: list[list[int]] = []
        for rid in sampling_req_ids:
            sampling = self.requests[rid].sampling
            drafts = spec.get(rid, [])
            drafts_per_req.append(drafts)
            rows.append(sampling)
            for j in range(1, len(drafts) + 1):  # row j sees the first j drafts as output (penalties, min_tokens)
                rows.append(SamplingRequestState(
                    params=sampling.params, prompt_token_ids=sampling.prompt_token_ids,
                    output_token_ids=sampling.output_token_ids + drafts[:j], generator=sampling.generator,
                    eos_token_id=sampling.eos_token_id))
            row_req_ids += [rid] * (len(drafts) + 1)
        metadata = build_sampling_metadata(rows, vocab_size=logits.shape[-1], device=self.device)
        # Requests with a grammar get no drafts (Scheduler._propose): their single row takes their mask.
        metadata.grammar_bitmask = self._grammar_bitmask(scheduler_output, row_req_ids)
        out = self.rejection_sampler(logits, metadata, drafts_per_req)
        logprobs: dict[str, LogprobsLists] = {}
        if out.logprobs is not None:
            ids, lps, ranks = (t.tolist() for t in (out.logprobs.token_ids, out.logprobs.logprobs, out.logprobs.ranks))
        emitted, first = {}, 0
        for rid, drafts, tokens in zip(sampling_req_ids, drafts_per_req, out.token_ids):
            state = self.requests[rid]
            state.token_ids.extend(tokens)
            state.sampling.output_token_ids.extend(tokens)
            state.num_computed_tokens -= len(drafts) - (len(tokens) - 1)
            emitted[rid] = tokens
            k = state.sampling.params.logprobs
            if out.logprobs is not None and k is not None:
                span = range(first, first + len(tokens))
                logprobs[rid] = LogprobsLists(token_ids=[ids[i][:k + 1] for i in span],
                                              logprobs=[lps[i][:k + 1] for i in span], ranks=[ranks[i] for i in span])
            first += len(tokens)
        self.prev_sampled, self.prev_rows = None, {}
        errors = {row_req_ids[row]: RequestFailure(why, ran=True)
                  for row, why in sorted(metadata.processor_errors.items())}
        return ModelRunnerOutput(req_ids=order, sampled_token_ids=[emitted.get(r, []) for r in order],
                                 logprobs=logprobs, failures=errors)

    def _fill_pending_inputs(self, inputs) -> None:
        """Put the previous step's samples, still on the device, into this step's input ids."""
        if not inputs.pending_rows:
            return
        src = [self.prev_rows[rid] for rid in inputs.pending_req_ids]
        if inputs.pending_rows == src == list(range(len(src))):  # steady decode: row i takes sample i
            inputs.input_ids[:len(src)].copy_(self.prev_sampled[:len(src)])
            return
        index = torch.tensor([inputs.pending_rows, src], dtype=torch.int64)
        if self.device.type == "cuda":
            index = index.pin_memory()
        index = index.to(self.device, non_blocking=True)
        inputs.input_ids[index[0]] = self.prev_sampled[index[1]]

    def _grammar_bitmask(self, scheduler_output: SchedulerOutput, sampling_req_ids: list[str]) -> torch.Tensor | None:
        """Spread the scheduler's bitmask rows over the sampling rows; unconstrained rows allow everything."""
        if scheduler_output.grammar_bitmask is None or not scheduler_output.structured_output_req_ids:
            return None
        rows = {rid: i for i, rid in enumerate(scheduler_output.structured_output_req_ids)}
        src = scheduler_output.grammar_bitmask
        full = np.full((len(sampling_req_ids), src.shape[1]), -1, dtype=np.int32)
        for row, rid in enumerate(sampling_req_ids):
            if rid in rows:
                full[row] = src[rows[rid]]
        return torch.from_numpy(full).to(self.device, non_blocking=True)

    def _forward(self, inputs, *, graphs=None, keep_hidden: bool = False
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Run the model, replaying one of ``graphs`` (a ``DecodeGraphs`` of decode or verification steps, or the
        ``MixedGraphs``; inputs built through its ``transfer``) when given; return (logits [num_logits, vocab] or
        None when nobody samples, and the hidden states [num_tokens, hidden] when ``keep_hidden``, else None;
        decode graphs return only the sampled rows' hidden states, so steps with prompt logprobs never replay
        them)."""
        if isinstance(graphs, DecodeGraphs):  # decode or verification graph: the hidden states of the logits rows
            rows = graphs.run(inputs)
            return (self.model.compute_logits(rows) if inputs.sampling_req_ids else None), None
        if graphs is None:
            hidden = self.model(inputs.input_ids, inputs.positions,
                                AttentionContext(metadata=inputs.metadata, kv_caches=self.kv_caches))
        elif graphs is self.mixed_graphs:  # a mixed-step graph ends with the hidden states
            hidden = graphs.run(inputs)
        else:  # pad_mixed_steps: the mixed graphs' padded layout, eagerly (tests)
            hidden = graphs.run_eager(inputs)
        logits = self.model.compute_logits(hidden[inputs.logits_indices]) if inputs.sampling_req_ids else None
        return logits, (hidden if keep_hidden else None)

    def _prompt_logprobs(self, order: list[str], inputs, hidden: torch.Tensor) -> dict[str, LogprobsLists]:
        """Logprobs of the prompt tokens this step's chunks predict, for requests with prompt_logprobs.

        The hidden state at position p scores prompt token p + 1; a chunk covering positions [c, c + n)
        yields rows for tokens c + 1 .. min(c + n, num_prompt_tokens - 1). Column 0 is the prompt token
        (its rank from the raw logits, like sampled logprobs), then the top ``prompt_logprobs``.
        Logits are made PROMPT_LOGPROBS_ROWS at a time so a long prompt never holds [T, vocab] at once.
        Called before num_computed_tokens moves past the chunk.
        """
        starts = inputs.metadata.query_start_loc_cpu.tolist()
        out: dict[str, LogprobsLists] = {}
        for i, rid in enumerate(order):
            state = self.requests[rid]
            k = state.sampling.params.prompt_logprobs
            first = state.num_computed_tokens
            last = min(first + starts[i + 1] - starts[i], state.num_prompt_tokens - 1)
            if k is None or last <= first:
                continue
            ids, lps, ranks = [], [], []
            for lo in range(first, last, PROMPT_LOGPROBS_ROWS):
                hi = min(lo + PROMPT_LOGPROBS_ROWS, last)
                rows = hidden[starts[i] + lo - first:starts[i] + hi - first]
                logprobs = torch.log_softmax(self.model.compute_logits(rows).float(), dim=-1)  # [R, V]
                targets = torch.tensor(state.token_ids[lo + 1:hi + 1], device=logprobs.device)[:, None]
                chosen = logprobs.gather(1, targets)  # [R, 1]
                top = logprobs.topk(k, dim=-1) if k else None
                ids += torch.cat([targets, top.indices], 1).tolist() if top else targets.tolist()
                lps += torch.cat([chosen, top.values], 1).tolist() if top else chosen.tolist()
                ranks += ((logprobs > chosen).sum(-1) + 1).tolist()
            out[rid] = LogprobsLists(token_ids=ids, logprobs=lps, ranks=ranks)
        return out


    # ---- profiling ------------------------------------------------------------------------------
    @torch.inference_mode()
    def profile_run(self, num_tokens: int, num_reqs: int) -> None:
        """One forward pass of ``num_reqs`` dummy prompts totalling ``num_tokens`` (peak activation memory).

        Uses a throwaway KV cache just large enough for the batch; the logits of every request are made,
        as in a real step.
        """
        num_reqs = max(1, min(num_reqs, num_tokens))
        per_req = num_tokens // num_reqs
        self._dummy_step([(per_req, 0)] * num_reqs, [per_req] * num_reqs, torch.Generator().manual_seed(0))

    def _dummy_step(self, requests: list[tuple[int, int]], num_scheduled: list[int],
                    generator: torch.Generator) -> None:
        """One forward pass (and the logits of each request) over random-token requests given as
        (length, tokens already computed), decodes first, on a throwaway KV cache just large enough for them."""
        states, first = [], 0
        for i, (length, computed) in enumerate(requests):
            num_blocks = -(-length // self.block_size)
            states.append(CachedRequestState(
                req_id=str(i), token_ids=torch.randint(0, self.hf_config.vocab_size, (length,),
                                                       generator=generator).tolist(),
                num_prompt_tokens=length, block_ids=list(range(first, first + num_blocks)),
                num_computed_tokens=computed, sampling=None))
            first += num_blocks
        inputs = build_step_inputs(states, num_scheduled, block_size=self.block_size, device=self.device)
        if self.lora_manager is not None:
            self.lora_manager.clear_batch()
        head_size, num_kv_heads, num_layers = self._kv_shape()
        shape = self.attn_backend.kv_cache_shape(first, self.block_size, num_kv_heads, head_size)
        kv = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(num_layers)]
        hidden = self.model(inputs.input_ids, inputs.positions,
                            AttentionContext(metadata=inputs.metadata, kv_caches=kv))
        self.model.compute_logits(hidden[inputs.logits_indices])


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Start copying a device tensor to (pinned) host memory without waiting."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class ReadyOutput:
    """An overlapped step's output that is known at once (nothing was sampled); ``get()`` returns it, as
    ``SampledTokens.get()`` does once its tokens arrive."""

    def __init__(self, output: ModelRunnerOutput):
        self.output = output

    def get(self) -> ModelRunnerOutput:
        return self.output


class SampledTokens:
    """A step's samples on their way to the host; ``get()`` waits for them and updates the runner's states.

    Invariant: a state's ``num_pending`` counts the SampledTokens not yet resolved that sampled it.
    """

    def __init__(self, runner: ModelRunner, req_ids: list[str], sampling_req_ids: list[str], out):
        self.runner = runner
        self.req_ids = req_ids
        self.sampling_req_ids = sampling_req_ids
        self.tokens = _to_host(out.sampled_token_ids)
        self.logprobs = None if out.logprobs is None else \
            (_to_host(out.logprobs.token_ids), _to_host(out.logprobs.logprobs), _to_host(out.logprobs.ranks))
        self.event = None
        self.failures: dict[str, RequestFailure] = {}  # ModelRunnerOutput.failures
        if out.sampled_token_ids.device.type == "cuda":
            self.event = torch.cuda.Event()
            self.event.record()

    def get(self) -> ModelRunnerOutput:
        if self.event is not None:
            self.event.synchronize()
        sampled: dict[str, list[int]] = {}
        for rid, tok in zip(self.sampling_req_ids, self.tokens.tolist()):
            sampled[rid] = [tok]
            state = self.runner.requests.get(rid)
            if state is not None and state.num_pending:  # gone or rebuilt after preemption: nothing to do
                state.token_ids.append(tok)
                state.sampling.output_token_ids.append(tok)
                state.num_pending -= 1
        logprobs: dict[str, LogprobsLists] = {}
        if self.logprobs is not None:
            ids, lps, ranks = (t.tolist() for t in self.logprobs)
            for row, rid in enumerate(self.sampling_req_ids):
                state = self.runner.requests.get(rid)
                k = None if state is None else state.sampling.params.logprobs
                if k is not None:
                    logprobs[rid] = LogprobsLists(token_ids=[ids[row][:k + 1]], logprobs=[lps[row][:k + 1]],
                                                  ranks=[ranks[row]])
        return ModelRunnerOutput(req_ids=self.req_ids, sampled_token_ids=[sampled.get(r, []) for r in self.req_ids],
                                 logprobs=logprobs, failures=self.failures)
