"""Hybrid KV cache groups end to end: a model whose layers alternate sliding-window and full attention (the tiny
gpt-oss of test_gpt_oss: window 16) gets two KV cache groups on one block pool. Greedy tokens equal transformers'
while the sliding-window group frees the blocks that leave the window (its blocks held per request stay within
window + one chunk), eagerly and in the padded layout of the mixed-step CUDA graphs (one block table and slot
mapping buffer per group)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from moe_checkpoints import greedy_reference
from test_gpt_oss import WINDOW, build_model, gpt_oss_config

from brigade import LLM, SamplingParams
from brigade.interfaces.kv_cache_spec import FullAttentionSpec, SlidingWindowSpec, cdiv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))
from padded_graphs import pad_steps  # noqa: E402

BLOCK = 16
CHUNK = 32
MAX_NEW_TOKENS = 48

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt-oss-hybrid")
    model = build_model(gpt_oss_config(), seed=1)
    model.save_pretrained(str(path))
    return path, model


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (90, 33, 61)]


def _record_held_blocks(llm: LLM) -> list[list[int]]:
    """After each schedule(), every scheduled request's held blocks per group (observed, not changed)."""
    sched = llm.engine.core.scheduler
    kv, schedule, held = sched.kv_cache_manager, sched.schedule, []

    def observed_schedule():
        out = schedule()
        held.extend(kv.num_held_blocks(rid) for rid in out.num_scheduled_tokens)
        return out

    sched.schedule = observed_schedule
    return held


@pytest.mark.parametrize("padded_mixed_steps", [False, True])
def test_sliding_window_group_is_bounded_and_tokens_equal_transformers(checkpoint, prompts, padded_mixed_steps):
    path, hf = checkpoint
    expected = greedy_reference(hf, prompts, MAX_NEW_TOKENS)
    llm = LLM(str(path), dtype="float32", max_model_len=192, block_size=BLOCK, max_num_batched_tokens=CHUNK,
              max_num_seqs=4, enable_prefix_caching=True, skip_tokenizer_init=True, mixed_capture_sizes=[8, 16, 32])
    runner = llm.engine.core.executor.worker.model_runner
    groups = runner.kv_cache_config.groups
    assert [(type(g.spec), g.layer_ids) for g in groups] == [(FullAttentionSpec, (1, 3)), (SlidingWindowSpec, (0, 2))]
    assert runner.layer_groups == [1, 0, 1, 0]
    dispatch = pad_steps(runner)
    dispatch.pad_mixed_steps = padded_mixed_steps
    held = _record_held_blocks(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                               use_tqdm=False)]
    assert got == expected
    bound = cdiv(WINDOW - 1 + CHUNK, BLOCK) + 1
    assert max(sliding for _, sliding in held) <= bound < max(full for full, _ in held)
    assert max(full for full, _ in held) == cdiv(90 + MAX_NEW_TOKENS - 1, BLOCK)
    if padded_mixed_steps:
        assert dispatch.num_padded_mixed_steps >= MAX_NEW_TOKENS
    # A second pass hits the prefix cache: full-attention blocks from the start, sliding ones for the window.
    again = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)[0]
    assert list(again.outputs[0].token_ids) == expected[0] and again.num_cached_tokens >= 80
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"
    llm.engine.core.shutdown()


def test_a_kv_connector_is_refused_for_a_hybrid_model_in_one_line(checkpoint, tmp_path):
    from brigade.config import ConfigError

    path, _ = checkpoint
    kv_config = {"kv_connector": "SharedMemoryConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"path": str(tmp_path)}}
    with pytest.raises(ConfigError) as err:
        LLM(str(path), dtype="float32", skip_tokenizer_init=True, num_gpu_blocks_override=64,
            kv_transfer_config=kv_config)
    assert str(err.value) == ("--kv-transfer-config: KV connectors move one block table a request, and this model's "
                              "layers form 2 KV cache groups (1 full, 1 sliding_window); serve it without a KV "
                              "connector, or a model whose attention layers all match")
