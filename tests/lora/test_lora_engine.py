"""LoRA end to end in the offline engine, on the real SmolLM2 weights in fp32 on the CPU: Brigade's greedy
tokens with an adapter equal HF transformers' with the delta merged into the weights (W + scale * B @ A),
in batches that mix the base model and several adapters, also with fewer slots than adapters."""

from __future__ import annotations

import pytest
from lora_utils import MAX_NEW_TOKENS

from brigade import LLM, SamplingParams
from brigade.lora import LoRARequest
from brigade.lora.adapter import LoRAError

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)


def make_llm(path, **kwargs) -> LLM:
    return LLM(str(path), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.1, enable_lora=True,
               **kwargs)


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return make_llm(smollm2_path, max_loras=2, max_lora_rank=8)


@pytest.fixture(scope="module")
def requests(lora_adapters) -> dict[str, LoRARequest]:
    return {name: LoRARequest(name, i, str(path)) for i, (name, path) in enumerate(lora_adapters.items(), start=1)}


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_adapters_change_outputs_and_match_merged_transformers(llm, requests, prompt_ids, hf_lora_tokens):
    for name in (None, "sql", "poet"):
        got = tokens(llm.generate(prompt_ids, GREEDY, use_tqdm=False, lora_request=requests.get(name)))
        assert got == hf_lora_tokens[name], name
    for name in ("sql", "poet"):  # the reference itself differs from the base model: the test tests something
        assert hf_lora_tokens[name] != hf_lora_tokens[None], name
    assert llm.get_kv_cache_stats()["num_free_blocks"] == llm.get_kv_cache_stats()["num_total_blocks"]


def test_a_batch_mixing_base_and_two_adapters(llm, requests, prompt_ids, hf_lora_tokens):
    """Every prompt under every choice, all in one generate call: each request gets its own adapter's tokens."""
    names = [None, "sql", "poet"]
    prompts = [ids for ids in prompt_ids for _ in names]
    loras = [requests.get(name) for _ in prompt_ids for name in names]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    expected = [hf_lora_tokens[name][i] for i in range(len(prompt_ids)) for name in names]
    assert tokens(outputs) == expected
    assert [o.lora_request for o in outputs] == loras  # each output says which adapter made it, as in vLLM
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_one_slot_serializes_two_adapters(smollm2_path, lora_adapters, prompt_ids, hf_lora_tokens):
    """--max-loras 1 with two adapters in flight: the scheduler never runs both in one step, every request
    completes with its own adapter's tokens, the slot is reused, and the KV blocks all come back."""
    llm = make_llm(smollm2_path, max_loras=1, max_lora_rank=8,
                   lora_modules={name: str(path) for name, path in lora_adapters.items()})
    manager = llm.engine.core.executor.worker.model_runner.lora_manager
    seen: list[set[str]] = []
    set_batch = manager.set_batch

    def recording(lora_ids, counts):  # the runner knows adapters by id: --lora-modules sql is 1, poet 2
        seen.append({n for n in lora_ids if n is not None})
        set_batch(lora_ids, counts)

    manager.set_batch = recording
    names = ["sql", "poet", None, "poet", "sql"]
    loras = [None if n is None else LoRARequest(n, 1 + list(lora_adapters).index(n), str(lora_adapters[n]))
             for n in names]
    got = tokens(llm.generate([prompt_ids[0]] * len(names), GREEDY, use_tqdm=False, lora_request=loras))
    assert got == [hf_lora_tokens[n][0] for n in names]
    assert max(len(s) for s in seen) == 1 and {1, 2} <= set().union(*seen)
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_bad_lora_requests_are_refused_before_anything_runs(llm, tmp_path, prompt_ids):
    with pytest.raises(LoRAError, match=r"LoRA adapter 'sql' is already registered with path"):
        llm.generate(prompt_ids[0], GREEDY, use_tqdm=False, lora_request=LoRARequest("sql", 1, str(tmp_path)))
    with pytest.raises(LoRAError, match=r"LoRA adapter 'nope' \(.*\): no adapter_config.json in the folder"):
        llm.generate(prompt_ids[0], GREEDY, use_tqdm=False, lora_request=LoRARequest("nope", 9, str(tmp_path)))
    assert not llm.engine.has_unfinished_requests()


def test_lora_request_without_enable_lora(smollm2_path, requests, prompt_ids):
    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=128, kv_cache_memory_gib=0.05)
    with pytest.raises(LoRAError, match="LoRA is not enabled; build the LLM with enable_lora=True"):
        llm.generate(prompt_ids[0], GREEDY, use_tqdm=False, lora_request=requests["sql"])


def test_slots_too_large_for_memory_are_one_error_naming_the_flags(smollm2_path):
    """The slots are allocated up front; a size the device cannot hold says which flags to lower."""
    with pytest.raises(LoRAError, match=r"--max-loras 10000000 x --max-lora-rank 8: the LoRA slots need "
                                        r"[\d.]+ GiB on cpu, which could not be allocated .*; lower --max-loras"):
        make_llm(smollm2_path, max_loras=10_000_000, max_lora_rank=8)
