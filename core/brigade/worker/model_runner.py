"""ModelRunner: turns a SchedulerOutput into one forward pass and one sampling call.

A step reads as ``execute_model``: update the request states from the scheduler's diffs
(``request_states``), plan the step (which CUDA graph, if any: ``graph_dispatch``), build its inputs
(``input_batch``), run the forward pass (with the KV connector's load and save around it: ``kv_connector_io``),
then sample (``step_sampler``; with overlap the samples reach the host later: ``async_output``) or verify
drafts (``draft_verifier``), with prompt logprobs where asked (``prompt_logprobs``). The runner decides *how*
to run the batch, never *who* runs.
"""

from __future__ import annotations

import torch

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.attention.fp8_kv import FP8_KV_DTYPE
from brigade.config import BrigadeConfig
from brigade.distributed import get_pp_group
from brigade.interfaces import KVConnectorMetadata, ModelRunnerOutput, RequestFailure, SchedulerOutput
from brigade.interfaces.kv_cache_spec import KVCacheConfig, KVCacheGroup, KVCacheSpec
from brigade.kv_transfer import KVCacheLayout, KVConnectorBase, KVConnectorRole, make_kv_connector
from brigade.sample.rejection_sampler import RejectionSampler
from brigade.worker.async_output import InFlightSamples, ReadyOutput, SampledTokens
from brigade.worker.cuda_graph import DecodeGraphs, default_capture_sizes
from brigade.worker.draft_verifier import DraftVerifier
from brigade.worker.expert_counts import ExpertCounts
from brigade.worker.graph_dispatch import GraphDispatch, StepPlan
from brigade.worker.input_batch import HostToDevice, StepInputs, build_step_inputs
from brigade.worker.kv_cache import KVCacheTensors, layer_groups
from brigade.worker.kv_connector_io import load_kv
from brigade.worker.prompt_logprobs import prompt_logprobs
from brigade.worker.request_states import RequestStates, StepBatch
from brigade.worker.step_sampler import StepSampler, plugin_sampler
from brigade.worker.warm_up import DummySteps, warm_up_sampler


class ModelRunner:
    """Owns the model, the KV cache tensors, the sampler, the CUDA graphs and the runner-side request states."""

    def __init__(self, config: BrigadeConfig, device: torch.device, dtype: torch.dtype,
                 attn_backend: type[AttentionBackend], hf_config):
        self.config = config
        self.device = device
        self.dtype = dtype
        self.attn_backend = attn_backend
        self.hf_config = hf_config
        self.block_size = config.cache_config.block_size
        self.pp = get_pp_group()  # one rank (a no-op group) without a pipeline
        self.kv_cache: KVCacheTensors | None = None  # from the model's KV cache specs, once it is loaded
        self.kv_cache_config: KVCacheConfig | None = None  # the engine's blocks and groups (initialize_kv_cache)
        self.layer_groups: list[int] | None = None  # per layer, its KV cache group; None with one group
        self.model: torch.nn.Module | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.sampler = plugin_sampler()
        self.sample = StepSampler(self.sampler, device)
        self.verify = DraftVerifier(RejectionSampler(self.sampler), device)  # speculative decoding
        self.requests = RequestStates(device)
        self.in_flight = InFlightSamples(device)  # samples on their way to the host (overlapped steps)
        self.transfer = HostToDevice(device)
        self.graphs = GraphDispatch(config, attn_backend, device)
        self.lora_manager = None  # brigade.lora.manager.LoRAManager with --enable-lora
        self.kv_connector: KVConnectorBase | None = None  # the worker-role KV connector (--kv-transfer-config)
        self.expert_counts: ExpertCounts | None = None  # an MoE model's routed tokens per expert, to report
        # Experts across data-parallel engines: every forward pass meets the other engines' (dp_lockstep.py).
        self.lockstep = config.parallel_config.data_parallel_lockstep

    # ---- set-up ---------------------------------------------------------------------------------
    def load_model(self) -> None:
        from brigade.model_executor.loader import load_model

        lora_config = self.config.lora_config
        self.model = load_model(self.config.model_config, self.hf_config, dtype=self.dtype, device=self.device,
                                attn_backend=self.attn_backend, fold_norms=lora_config is None,
                                expert_parallel=self.config.parallel_config.enable_expert_parallel)
        cache_dtype = FP8_KV_DTYPE if self.config.cache_config.fp8_kv_cache else None
        specs = self.model.kv_cache_specs(self.block_size, cache_dtype or self.dtype)
        self.kv_cache = KVCacheTensors(self.attn_backend, specs, self.dtype, cache_dtype)
        if self.config.cache_config.fp8_kv_cache:  # where the fp8 KV cache's k/v scales come from, in one line
            from brigade.model_executor.kv_scales import log_kv_scales

            log_kv_scales(self.model)
        load = self.model.expert_load
        self.expert_counts = ExpertCounts(load) if load is not None else None  # MoE models
        self.vocab_size = self.hf_config.vocab_size
        if lora_config is not None:
            self._init_lora(lora_config)

    def _init_lora(self, lora_config) -> None:
        """Give the model's projections LoRA slots and load the --lora-modules adapters."""
        from brigade.lora.manager import LoRAManager
        from brigade.lora.request import lora_module_requests

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

    def kv_cache_specs(self) -> dict[int, KVCacheSpec]:
        """The KV cache spec of each attention layer this rank holds (``CausalLM.kv_cache_specs``)."""
        return dict(self.kv_cache.specs)

    def kv_cache_bytes_per_block(self, groups: tuple[KVCacheGroup, ...], cache_dtype: torch.dtype | None = None
                                 ) -> int:
        """Bytes one block id takes on this rank under ``groups`` (``KVCacheTensors.bytes_per_block``), in
        ``cache_dtype`` (default: the cache's)."""
        return self.kv_cache.bytes_per_block(groups, cache_dtype)

    def kv_cache_layout(self) -> KVCacheLayout:
        """The layout of this runner's KV blocks, for KV connectors (``KVCacheTensors.layout``)."""
        num_layers = sum(len(group.layer_ids) for group in self.kv_cache_config.groups)
        return self.kv_cache.layout(self.config.model_config, num_layers)

    def initialize_kv_cache(self, config: KVCacheConfig) -> None:
        """Allocate the KV tensors of ``config`` (one view per layer), make the KV connector, capture the CUDA
        graphs, warm up."""
        self.kv_cache_config = config
        self.layer_groups = layer_groups(config)
        self.kv_caches = self.kv_cache.allocate(config, self.device)
        if self.config.kv_transfer_config is not None:
            self.kv_connector = make_kv_connector(self.config.kv_transfer_config, KVConnectorRole.WORKER,
                                                  self.kv_cache_layout())
        self.graphs.capture(self.model, self.kv_caches, lora=self.lora_manager is not None,
                            layer_groups=self.layer_groups)
        if self.device.type != "cpu" and self.pp.world_size == 1:  # nothing is compiled on first use on the CPU
            self.warm_up_mixed_steps()
            self.warm_up_sampler()
        if self.expert_counts is not None:  # only served tokens count
            self.expert_counts.reset()

    def profile_run(self, num_tokens: int, num_reqs: int, groups: tuple[KVCacheGroup, ...]) -> None:
        """One forward pass of ``num_reqs`` dummy prompts totalling ``num_tokens`` (``DummySteps.profile``) under
        the KV cache ``groups`` to come."""
        self._dummy_steps(groups).profile(num_tokens, num_reqs)

    def warm_up_mixed_steps(self) -> None:
        """Compile the kernels of mixed decode and prefill steps now (``DummySteps.warm_up_mixed_steps``)."""
        self._dummy_steps().warm_up_mixed_steps(self.config.model_config.max_model_len)

    def warm_up_sampler(self) -> None:
        """Compile the sampler's kernels now (``warm_up.warm_up_sampler``)."""
        warm_up_sampler(self.sampler, self.vocab_size, self.dtype, self.device)

    def _dummy_steps(self, groups: tuple[KVCacheGroup, ...] | None = None) -> DummySteps:
        return DummySteps(self.model, self.kv_cache, groups or self.kv_cache_config.groups, self.hf_config.vocab_size,
                          self.device, self.lora_manager)

    @torch.inference_mode()
    def execute_dummy_batch(self) -> None:
        """One forward pass of a single random token on a throwaway one-block KV cache (``DummySteps.run``), or,
        when the other engines replay a decode CUDA graph, that graph on padding rows: no KV write that matters,
        no sample, no expert count. A lockstep data-parallel engine with nothing to compute runs it so that the
        other engines' MoE collectives find this rank (vLLM's ``_dummy_run``)."""
        if self.expert_counts is not None:
            self.expert_counts.load.begin_step(0)
        plan = self.graphs.agree_across_dp(None, 0) if self.lockstep else StepPlan()
        if plan.graphs is not None:  # the other engines replay a decode graph: the same one, on padding rows
            plan.graphs.run_padding(plan.min_size)
            return
        self._dummy_steps().run([(1, 0)], [1], torch.Generator().manual_seed(0))

    def _maybe_dummy_forward(self) -> None:
        """A step with nothing to compute still runs a forward pass when data-parallel engines step in lockstep:
        the engine loop sent it because another engine computes (``execute_dummy_batch``)."""
        if self.lockstep:
            self.execute_dummy_batch()

    def shutdown(self) -> None:
        """Shut the worker-role KV connector down (its threads, sockets, registered memory); idempotent."""
        if self.kv_connector is not None:
            self.kv_connector.shutdown()

    # ---- one step -------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput, *,
                      overlap: bool = False) -> ModelRunnerOutput | SampledTokens | ReadyOutput:
        """Run the scheduled tokens through the model and sample for requests that reach their end.

        With ``overlap`` it returns as soon as the work is queued on the device: a SampledTokens whose ``get()``
        waits for the tokens (a ReadyOutput when nothing was sampled). The next step may then be prepared and
        launched first; its inputs take those tokens straight from the device (vLLM v1's asynchronous
        scheduling).

        A scheduled request on a LoRA adapter whose evicted host weights cannot be read again is left out of
        the step and named in the output's ``failures`` as not run (the scheduler aborts it); the others run.
        """
        self.in_flight.apply_resolved(self.requests)
        self.requests.update(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            self._maybe_dummy_forward()
            return ModelRunnerOutput.make_empty()
        connector_meta = scheduler_output.kv_connector_metadata if self.kv_connector is not None else None
        num_scheduled, failed = self._runnable_tokens(scheduler_output, connector_meta)
        output = ModelRunnerOutput(req_ids=[], sampled_token_ids=[],
                                   failures={rid: RequestFailure(why, ran=False) for rid, why in failed.items()})
        if not num_scheduled:
            self._maybe_dummy_forward()
            return self._finish(ReadyOutput(output), overlap)
        batch = self.requests.batch(num_scheduled, scheduler_output.scheduled_spec_decode_tokens)
        plan = self.graphs.plan(batch, lora=self.lora_manager is not None)
        if self.lockstep:  # every engine replays the same graph size, or none does
            plan = self.graphs.agree_across_dp(plan, len(batch.req_ids))
        inputs = self._build_inputs(batch, plan)
        if self.expert_counts is not None:  # rows past the step's tokens (graph padding) are not counted
            self.expert_counts.load.begin_step(batch.num_tokens)
        logits, hidden = self._forward(inputs, plan, keep_hidden=batch.want_prompt_logprobs)
        if connector_meta is not None:
            self.kv_connector.save_kv(connector_meta, self.kv_caches)
        if batch.want_prompt_logprobs and hidden is not None:  # the last pipeline stage's
            output.prompt_logprobs = prompt_logprobs(self.model, batch, inputs, hidden)
        self.requests.advance(batch)
        return self._finish(self._sample_or_verify(scheduler_output, batch, inputs, logits, output), overlap)

    def _runnable_tokens(self, scheduler_output: SchedulerOutput, connector_meta: KVConnectorMetadata | None
                         ) -> tuple[dict[str, int], dict[str, str]]:
        """The tokens to compute per request (the scheduler's, plus the ranges a failed KV load leaves to
        compute), less the requests whose LoRA adapter cannot run (its evicted host weights cannot be read
        again; ``LoRAManager.maybe_reload`` reads the others back); and those left out: id -> the LoRAError line.
        """
        num_scheduled = scheduler_output.num_scheduled_tokens
        if connector_meta is not None:
            num_scheduled = load_kv(self.kv_connector, connector_meta, self.kv_caches, self.requests, num_scheduled)
        if self.lora_manager is None:
            return num_scheduled, {}
        adapters = {rid: self.requests[rid].lora_int_id for rid in num_scheduled}
        unreadable = self.lora_manager.maybe_reload(adapters.values())
        failed = {rid: unreadable[a] for rid, a in adapters.items() if a in unreadable} if unreadable else {}
        return {rid: n for rid, n in num_scheduled.items() if rid not in failed}, failed

    def _build_inputs(self, batch: StepBatch, plan: StepPlan) -> StepInputs:
        """The step's device inputs, through the planned graphs' buffers when it replays one, with the last
        step's samples (still on the device) in the rows that take them; LoRA slots set for the batch."""
        if self.lora_manager is not None:  # slots and token mask for this step (persistent buffers: graph-safe)
            self.lora_manager.set_batch([s.lora_int_id for s in batch.states], batch.num_scheduled)
        inputs = build_step_inputs(batch.states, batch.num_scheduled, block_size=self.block_size, device=self.device,
                                   transfer=self.transfer if plan.graphs is None else plan.transfer,
                                   spec_token_ids=batch.drafts, uniform_query_len=plan.uniform_query_len,
                                   layer_groups=self.layer_groups)
        self.in_flight.fill_inputs(inputs)
        return inputs

    def _forward(self, inputs: StepInputs, plan: StepPlan, *, keep_hidden: bool = False
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Run the model, eagerly or replaying ``plan.graphs``; return (logits [num_logits, vocab], or None when
        nobody samples; the hidden states [num_tokens, hidden] when ``keep_hidden``, else None). Decode and
        verification graphs return only the sampled rows' hidden states, so steps with prompt logprobs never
        replay them."""
        if self.pp.world_size > 1:
            return self._forward_stage(inputs, keep_hidden)
        if isinstance(plan.graphs, DecodeGraphs):
            rows = self.graphs.replay(plan, inputs)
            return (self.model.compute_logits(rows) if inputs.sampling_req_ids else None), None
        if plan.graphs is None:
            hidden = self.model(inputs.input_ids, inputs.positions, self._context(inputs))
        else:  # a mixed-step graph ends with the hidden states of every token row
            hidden = self.graphs.replay(plan, inputs)
        logits = self.model.compute_logits(hidden[inputs.logits_indices]) if inputs.sampling_req_ids else None
        return logits, (hidden if keep_hidden else None)

    def _context(self, inputs: StepInputs) -> AttentionContext:
        return AttentionContext(metadata=inputs.metadata, kv_caches=self.kv_caches,
                                layer_metadata=inputs.layer_metadata)

    def _forward_stage(self, inputs: StepInputs, keep_hidden: bool
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``_forward`` on one pipeline stage (always eager): start from the previous stage's residual stream
        (the first stage embeds), run this stage's layers, and send the stream on; only the last stage has
        logits (and hidden states) to return."""
        pp = self.pp
        intermediate = None if pp.is_first_rank else pp.recv_tensor_dict()
        out = self.model(inputs.input_ids, inputs.positions, self._context(inputs), intermediate)
        if not pp.is_last_rank:
            pp.send_tensor_dict(out)
            return None, None
        logits = self.model.compute_logits(out[inputs.logits_indices]) if inputs.sampling_req_ids else None
        return logits, (out if keep_hidden else None)

    def _sample_or_verify(self, scheduler_output: SchedulerOutput, batch: StepBatch, inputs: StepInputs,
                          logits: torch.Tensor | None, output: ModelRunnerOutput) -> ReadyOutput | SampledTokens:
        """Complete ``output`` (its failures and prompt logprobs set) with the step's tokens: none when no
        request reaches its end; the verified drafts and one more token each (applied to the request states at
        once); else one sample each, on its way to the host (``SampledTokens``)."""
        sampling_req_ids = inputs.sampling_req_ids
        output.req_ids, output.sampled_token_ids = batch.req_ids, [[] for _ in batch.req_ids]
        if not sampling_req_ids:  # only prompt chunks that do not reach their end: nothing to sample
            return ReadyOutput(output)
        if batch.drafts is not None and logits is None:  # a pipeline stage before the last: the last verifies
            for state, drafts in zip(batch.states, batch.drafts):
                state.unverified_drafts = drafts if drafts else None
            return ReadyOutput(output)
        if batch.drafts is not None:
            verified = self.verify(self.requests, sampling_req_ids, logits, scheduler_output)
            for rid, tokens in verified.tokens.items():
                self.requests.append_verified(rid, tokens, verified.num_drafts[rid])
            self.in_flight.forget_last()
            output.sampled_token_ids = [verified.tokens.get(rid, []) for rid in batch.req_ids]
            output.logprobs = verified.logprobs
            output.failures.update({rid: RequestFailure(why, ran=True) for rid, why in verified.errors.items()})
            if self.expert_counts is not None:  # the verification waited for the device already
                output.expert_tokens = self.expert_counts.take(self.expert_counts.load.counts.cpu())
            return ReadyOutput(output)
        if logits is None:  # a pipeline stage before the last: it learns the tokens from the next schedule
            return ReadyOutput(output)
        rows = [self.requests[rid].sampling for rid in sampling_req_ids]
        samples, errors = self.sample(logits, rows, sampling_req_ids, scheduler_output,
                                      self.in_flight.pending_for(sampling_req_ids, self.requests))
        output.failures.update({rid: RequestFailure(why, ran=True) for rid, why in errors.items()})
        # Queued before the samples' event: the wait for the tokens covers the copy of the expert counts too.
        snapshot = None if self.expert_counts is None else self.expert_counts.snapshot()
        result = self.in_flight.launch(samples, self.requests, batch.req_ids, sampling_req_ids, output)
        if snapshot is not None:
            result.expert_counts = (self.expert_counts, snapshot)
        return result

    def _finish(self, result: ReadyOutput | SampledTokens,
                overlap: bool) -> ModelRunnerOutput | SampledTokens | ReadyOutput:
        """With ``overlap``, the step's output as it is; else its ``get()``, the samples applied to the states."""
        if overlap:
            return result
        output = result.get()
        self.in_flight.apply_resolved(self.requests)
        return output
