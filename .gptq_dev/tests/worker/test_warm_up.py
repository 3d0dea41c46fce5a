"""The model runner's start-up warm-ups (run on accelerators, where kernels compile on first use) touch nothing
a request can see: the mixed steps run on a throwaway KV cache, and generation afterwards is unchanged. Called
directly here on the CPU, where start-up skips them."""

from __future__ import annotations

import torch

from brigade import LLM, SamplingParams


def test_warm_ups_mix_decodes_with_prefills_and_leave_no_trace(smollm2_path):
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=512)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    before = llm.generate([[1, 2, 3, 4]], params, use_tqdm=False)[0].outputs[0].token_ids
    runner = llm.engine.core.executor.worker.model_runner
    cache = [c.clone() for c in runner.kv_caches]
    seen = []
    hook = runner.model.register_forward_pre_hook(
        lambda module, args: seen.append((args[2].metadata.num_decodes, args[2].metadata.num_reqs,
                                          args[2].metadata.max_seq_len)))
    try:
        runner.warm_up_mixed_steps()
        runner.warm_up_sampler()
    finally:
        hook.remove()
    assert seen == [(1, 2, 41), (1, 2, 301)]  # one decode and one prefill per step, both context classes
    assert all(torch.equal(a, b) for a, b in zip(cache, runner.kv_caches))
    assert llm.generate([[1, 2, 3, 4]], params, use_tqdm=False)[0].outputs[0].token_ids == before
