"""Start-up steps outside serving: the profiling step that sizes the KV pool, and the warm-ups that compile
kernels before the first request.

Each runs on a throwaway KV cache just large enough for it; the real cache is untouched.
"""

from __future__ import annotations

import torch

from brigade.attention.backend import AttentionContext
from brigade.sample.metadata import SamplingRequestState, build_sampling_metadata
from brigade.sample.sampler import Sampler
from brigade.sampling_params import SamplingParams
from brigade.worker.input_batch import CachedRequestState, build_step_inputs
from brigade.interfaces.kv_cache_spec import KVCacheConfig, KVCacheGroup
from brigade.worker.kv_cache import KVCacheTensors, layer_groups


class DummySteps:
    """Forward passes over random-token requests, for a model, its KV cache tensors and KV cache groups."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCacheTensors, groups: tuple[KVCacheGroup, ...],
                 vocab_size: int, device: torch.device, lora_manager=None):
        """``lora_manager``: the runner's ``LoRAManager`` (its batch is cleared: the steps run the base model)."""
        self.model = model
        self.kv_cache = kv_cache
        self.groups = groups
        self.vocab_size = vocab_size
        self.device = device
        self.lora_manager = lora_manager

    @torch.inference_mode()
    def profile(self, num_tokens: int, num_reqs: int) -> None:
        """One forward pass of ``num_reqs`` dummy prompts totalling ``num_tokens`` (peak activation memory);
        the logits of every request are made, as in a real step."""
        num_reqs = max(1, min(num_reqs, num_tokens))
        per_req = num_tokens // num_reqs
        self.run([(per_req, 0)] * num_reqs, [per_req] * num_reqs, torch.Generator().manual_seed(0))

    @torch.inference_mode()
    def warm_up_mixed_steps(self, max_model_len: int) -> None:
        """Run two eager steps that mix a decode with a prefill (a 40-token context with a 3-token prompt, a
        300-token context with a 17-token prompt: one and several decode splits, a step small enough for the
        few-row GEMM kernels and one that is not), so the kernels such steps use outside the CUDA graphs compile
        now and not under the first request that arrives while others decode (a Triton compile stalls every
        running request for about a second)."""
        generator = torch.Generator().manual_seed(0)
        for context, prompt in sorted({(min(40, max_model_len - 2), 3), (min(300, max_model_len - 2), 17)}):
            if context < 1:
                continue
            prompt = min(prompt, max_model_len)
            self.run([(context + 1, context), (prompt, 0)], [1, prompt], generator)

    def run(self, requests: list[tuple[int, int]], num_scheduled: list[int], generator: torch.Generator) -> None:
        """One forward pass (and the logits of each request) over random-token requests given as (length, tokens
        already computed), decodes first, on a throwaway KV cache just large enough for them. Every KV cache
        group gets the same block ids (the tensors are shared, so the groups' KV overwrite each other: the
        outputs are not read), and each its own block table and slot mapping, as in a real step."""
        states, first = [], 0
        for i, (length, computed) in enumerate(requests):
            num_blocks = -(-length // self.kv_cache.block_size)
            states.append(CachedRequestState(
                req_id=str(i), token_ids=torch.randint(0, self.vocab_size, (length,), generator=generator).tolist(),
                num_prompt_tokens=length,
                block_ids=tuple(list(range(first, first + num_blocks)) for _ in self.groups),
                num_computed_tokens=computed, sampling=None))
            first += num_blocks
        config = KVCacheConfig(first, self.groups)
        inputs = build_step_inputs(states, num_scheduled, block_size=self.kv_cache.block_size, device=self.device,
                                   layer_groups=layer_groups(config))
        if self.lora_manager is not None:
            self.lora_manager.clear_batch()
        kv = self.kv_cache.allocate(config, self.device)
        ctx = AttentionContext(metadata=inputs.metadata, kv_caches=kv, layer_metadata=inputs.layer_metadata)
        hidden = self.model(inputs.input_ids, inputs.positions, ctx)
        if isinstance(hidden, torch.Tensor):  # a pipeline stage before the last has no logits to compute
            self.model.compute_logits(hidden[inputs.logits_indices])


@torch.inference_mode()
def warm_up_sampler(sampler: Sampler, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """Sample once from dummy logits ([1, vocab_size] of ``dtype``) per kind of plain batch (greedy, random,
    random with a temperature), so that a platform's fused sampler compiles its kernels now and not under the
    first requests (a compile stalls every running request; vLLM warms its sampler the same way)."""
    logits = torch.randn(1, vocab_size, device=device).to(dtype)
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
                   SamplingParams(temperature=0.7)):
        state = SamplingRequestState(params=params, prompt_token_ids=[0], output_token_ids=[], generator=None,
                                     eos_token_id=None)
        sampler(logits, build_sampling_metadata([state], vocab_size=vocab_size, device=device))
