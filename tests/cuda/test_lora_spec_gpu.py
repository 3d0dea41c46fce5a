"""LoRA and n-gram speculative decoding on a CUDA GPU (Triton attention, decode CUDA graphs) against HF.

A small random-weight Llama is built with transformers in fp32. With a PEFT adapter, Brigade's greedy tokens
must equal transformers' with the delta merged into the weights (W + scale * B @ A), in batches mixing the base
model and two adapters, with and without decode graphs. With n-gram speculation, greedy tokens must equal
transformers' and Brigade's own without speculation, with drafts both accepted and rejected. Skips without CUDA.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lora"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))
from lora_utils import merged_lora, write_adapter  # noqa: E402
from padded_graphs import pad_steps  # noqa: E402
from tiny_llama import tiny_llama_config  # noqa: E402

NUM_NEW = 48
ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model path, adapter paths, prompts, greedy tokens of HF per adapter name, None being the base)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_llama_config(initializer_range=0.05)
    model = LlamaForCausalLM(config).eval()
    root = tmp_path_factory.mktemp("tiny-lora")
    model.save_pretrained(root / "model")
    adapters = {
        "all": write_adapter(root / "all", config, seed=1, rank=8, alpha=16, targets=ALL_MODULES, std=0.1),
        "qv": write_adapter(root / "qv", config, seed=2, rank=4, alpha=8, use_rslora=True, std=0.15),
    }
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 33, 90, 200)]
    pattern = torch.randint(0, 512, (12,), generator=gen).tolist()
    prompts.append(pattern * 6)  # repeats: the n-gram proposer has something to draft from
    # (initializer_range 0.05: greedy continuations of this random model fall into loops and leave them, so
    # drafts are both accepted and rejected)
    model = model.to("cuda")
    expected = {}
    with torch.inference_mode():
        for name in [None, *adapters]:
            ctx = merged_lora(model, adapters[name]) if name else _null()
            with ctx:
                expected[name] = [_greedy(model, p) for p in prompts]
    del model
    torch.cuda.empty_cache()
    for name in adapters:
        assert expected[name] != expected[None], f"adapter {name} does not change the reference: test is void"
    return str(root / "model"), adapters, prompts, expected


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt], device="cuda")
    out = model.generate(ids, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def _assert_pool_whole(llm) -> None:
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


@pytest.mark.parametrize("eager", [False, True], ids=["cudagraphs", "eager"])
def test_lora_batches_equal_merged_transformers(tiny, eager):
    from brigade import LLM, SamplingParams
    from brigade.lora import LoRARequest

    path, adapters, prompts, expected = tiny
    llm = LLM(path, dtype="float32", skip_tokenizer_init=True, kv_cache_memory_gib=2, max_model_len=512,
              enable_lora=True, max_loras=2, max_lora_rank=8, enforce_eager=eager)
    assert llm.engine.core.executor.worker.model_runner.attn_backend.name == "triton"
    requests = {name: LoRARequest(name, i, str(p)) for i, (name, p) in enumerate(adapters.items(), start=1)}
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    names = [None, "all", "qv"]
    batch = [p for p in prompts for _ in names]
    loras = [requests.get(n) for _ in prompts for n in names]
    outputs = llm.generate(batch, params, use_tqdm=False, lora_request=loras)
    want = [expected[n][i] for i in range(len(prompts)) for n in names]
    for k, (got, ref) in enumerate(zip(_tokens(outputs), want)):
        assert got == ref, f"prompt {k // 3} with adapter {names[k % 3]} differs from merged transformers"
    # One adapter at a time, batch 1 (the batch-1 decode graph), then the base model alone: the slots' state
    # left by the mixed batch must not leak into either.
    for n in ("qv", None):
        got = _tokens(llm.generate(prompts[:2], params, use_tqdm=False, lora_request=requests.get(n)))
        assert got == expected[n][:2], n
    _assert_pool_whole(llm)
    del llm
    torch.cuda.empty_cache()


@pytest.mark.parametrize("eager", [False, True], ids=["cudagraphs", "eager"])
def test_ngram_speculation_equals_transformers(tiny, eager):
    from brigade import LLM, SamplingParams

    path, _, prompts, expected = tiny
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    llm = LLM(path, dtype="float32", skip_tokenizer_init=True, kv_cache_memory_gib=2, max_model_len=512,
              speculative_config=spec, enforce_eager=eager)
    runner = llm.engine.core.executor.worker.model_runner
    dispatch = pad_steps(runner)  # counts the verification steps run padded (its switches stay off)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for i, (got, ref) in enumerate(zip(_tokens(outputs), expected[None])):
        assert got == ref, f"prompt {i} differs from transformers under speculation"
    for i, p in enumerate(prompts):  # batch 1 as well
        assert _tokens(llm.generate([p], params, use_tqdm=False))[0] == expected[None][i], i
    if eager:
        assert runner.graphs.verify is None
    else:  # verification steps replayed their CUDA graphs (1 + k tokens a request, padded)
        assert runner.graphs.verify is not None and runner.graphs.verify.num_replays > 0
        assert dispatch.num_padded_spec_steps == runner.graphs.verify.num_replays
    totals = llm.engine.core.scheduler.spec_totals
    assert totals["num_draft_tokens"] > 0, "no drafts were proposed: the test tests nothing"
    assert 0 < totals["num_accepted_tokens"] < totals["num_draft_tokens"], totals  # both accepted and rejected
    _assert_pool_whole(llm)
    del llm
    torch.cuda.empty_cache()
