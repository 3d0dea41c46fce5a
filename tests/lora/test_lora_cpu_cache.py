"""--max-cpu-loras, as in vLLM: the runner keeps the host weights of at most that many adapters (an LRU cache)
while every registered adapter stays served; one evicted is read again from its folder when a step needs it,
and one whose folder is gone by then fails only its own requests. On the real SmolLM2 weights in fp32 on the
CPU, against the greedy tokens of the same engine with room for every adapter and of HF transformers."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from lora_utils import MAX_NEW_TOKENS, edit_tensors, write_adapter

from brigade import LLM, SamplingParams
from brigade.config import ConfigError, LoRAConfig, config_from_kwargs
from brigade.lora import LoRARequest

# Fewer tokens than the HF reference's MAX_NEW_TOKENS (greedy: they are its first ones), to keep the CPU steps few.
NUM_TOKENS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def hf(hf_lora_tokens) -> dict:
    """HF transformers' greedy tokens (conftest), cut to NUM_TOKENS; each adapter's differ from the base's."""
    assert NUM_TOKENS <= MAX_NEW_TOKENS
    cut = {name: [t[:NUM_TOKENS] for t in per_prompt] for name, per_prompt in hf_lora_tokens.items()}
    assert all(cut[name] != cut[None] for name in cut if name is not None)
    return cut


def make_llm(path, adapters: dict, **kwargs) -> LLM:
    return LLM(str(path), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.1, enable_lora=True,
               max_lora_rank=8, lora_modules={name: str(p) for name, p in adapters.items()}, **kwargs)


def manager_of(llm: LLM):
    return llm.engine.core.executor.worker.model_runner.lora_manager


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def three(lora_adapters, tmp_path_factory, smollm2_config) -> dict:
    """sql and poet (conftest) and a third adapter; registered in this order they get ids 1, 2, 3."""
    third = write_adapter(tmp_path_factory.mktemp("third") / "third", smollm2_config, seed=3, rank=8, alpha=16,
                          targets=("q_proj", "o_proj", "up_proj", "down_proj"), std=0.08)
    return {**lora_adapters, "third": third}


CALLS = ["sql", "poet", "third", "sql"]  # one generate call each, both prompts
MIXED = ["poet", "third", "sql"] * 2  # then one call whose requests alternate among the three


def run_alternating(llm: LLM, prompt_ids) -> tuple[list, list[int]]:
    """The CALLS, then the MIXED call. Returns the tokens of every call and the manager's host-cache size
    after each step's ``set_batch``."""
    manager = manager_of(llm)
    sizes: list[int] = []
    set_batch = manager.set_batch

    def recording(lora_ids, counts):
        set_batch(lora_ids, counts)
        sizes.append(len(manager.host_weights))

    manager.set_batch = recording
    requests = llm.engine.lora_requests
    got = [tokens(llm.generate(prompt_ids, GREEDY, use_tqdm=False, lora_request=requests[name])) for name in CALLS]
    got.append(tokens(llm.generate([prompt_ids[0]] * len(MIXED), GREEDY, use_tqdm=False,
                                   lora_request=[requests[n] for n in MIXED])))
    return got, sizes


def test_one_host_copy_serves_three_adapters(smollm2_path, three, prompt_ids, hf):
    """--max-loras 1 --max-cpu-loras 1, three adapters registered: all three stay served, at most one adapter's
    weights are on the host at any step, each change of adapter reads the new one again from its folder, and
    the tokens are those of an engine that keeps all three (and transformers' with the delta merged)."""
    small = make_llm(smollm2_path, three, max_loras=1, max_cpu_loras=1)
    manager = manager_of(small)
    assert sorted(manager.registry) == [1, 2, 3] and list(manager.host_weights) == [3]  # the last registered
    got, sizes = run_alternating(small, prompt_ids)
    assert sizes and max(sizes) == 1
    assert len(manager.host_weights) == 1 and manager.num_reloads == 4 + 3
    # 4: each of the CALLS needs an adapter other than the one cached (third, the last registered, at first);
    # 3: the mixed call runs the adapters one after the other (--max-loras 1, first come first), poet first.
    assert not manager.failed

    roomy = make_llm(smollm2_path, three, max_loras=1, max_cpu_loras=3)
    want, roomy_sizes = run_alternating(roomy, prompt_ids)
    assert manager_of(roomy).num_reloads == 0 and max(roomy_sizes) == 3
    assert got == want
    by_name = dict(zip(CALLS, want))
    assert by_name["sql"] == hf["sql"] == want[3] and by_name["poet"] == hf["poet"]
    assert by_name["third"] not in (hf[None], by_name["sql"], by_name["poet"])  # it changes the tokens
    assert got[-1] == [by_name[n][0] for n in MIXED]
    stats = small.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_a_slot_keeps_its_copy_after_the_host_copy_is_evicted(smollm2_path, three, prompt_ids, hf):
    """Registering an adapter evicts the least recently used host copy, here one of an adapter that holds a
    slot: it keeps running from the slot, with no reload and the same tokens."""
    llm = make_llm(smollm2_path, {n: three[n] for n in ("sql", "poet")}, max_loras=2, max_cpu_loras=2)
    manager = manager_of(llm)
    requests = llm.engine.lora_requests
    both = tokens(llm.generate([prompt_ids[0]] * 2, GREEDY, use_tqdm=False,
                               lora_request=[requests["sql"], requests["poet"]]))
    assert both == [hf["sql"][0], hf["poet"][0]]
    assert sorted(manager.slots) == [1, 2]
    assert llm.engine.add_lora(LoRARequest("third", 3, str(three["third"])))
    assert len(manager.host_weights) == 2 and requests["third"].lora_int_id in manager.host_weights
    evicted = next(n for n in ("sql", "poet") if requests[n].lora_int_id not in manager.host_weights)
    assert requests[evicted].lora_int_id in manager.slots
    again = tokens(llm.generate(prompt_ids, GREEDY, use_tqdm=False, lora_request=requests[evicted]))
    assert again == hf[evicted] and manager.num_reloads == 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "overlapped"])
def test_an_adapter_whose_folder_is_gone_fails_only_its_requests(smollm2_path, lora_adapters, tmp_path, prompt_ids,
                                                                 hf, async_scheduling):
    """The weights of "gone" were evicted and its folder deleted: a request on it ends at once as "abort" with
    a one-line reason naming it; the base-model and other-adapter requests of the same batch get their tokens.
    The adapter stays refused (even once its folder is back: blocks of its failed requests were published to
    the prefix cache under its id) until it is unregistered; registered again, it is a new adapter and runs."""
    gone = shutil.copytree(lora_adapters["sql"], tmp_path / "gone")
    kept = shutil.copytree(lora_adapters["poet"], tmp_path / "kept")
    llm = make_llm(smollm2_path, {"gone": gone, "kept": kept}, max_loras=1, max_cpu_loras=1,
                   async_scheduling=async_scheduling)
    manager = manager_of(llm)
    requests = dict(llm.engine.lora_requests)
    assert list(manager.host_weights) == [requests["kept"].lora_int_id]
    shutil.rmtree(gone)
    reason = (f"LoRA adapter 'gone' ({gone}): not a folder; give a PEFT adapter folder holding adapter_config.json "
              "and adapter_model.safetensors; its host weights had been evicted (--max-cpu-loras 1) and cannot be "
              "read again: its requests are aborted until it is unloaded and loaded again")
    outputs = llm.generate([prompt_ids[0]] * 4, GREEDY, use_tqdm=False,
                           lora_request=[None, requests["gone"], requests["kept"], requests["gone"]])
    assert tokens(outputs)[0] == hf[None][0] and tokens(outputs)[2] == hf["poet"][0]
    for failed in (outputs[1], outputs[3]):
        assert failed.finished and failed.outputs[0].finish_reason == "abort"
        assert failed.outputs[0].token_ids == [] and failed.outputs[0].stop_reason == reason
    assert manager.failed == {requests["gone"].lora_int_id: reason}

    shutil.copytree(lora_adapters["sql"], gone)
    late = llm.generate(prompt_ids[0], GREEDY, use_tqdm=False, lora_request=requests["gone"])[0].outputs[0]
    assert late.finish_reason == "abort" and late.stop_reason == reason and manager.num_reloads == 0
    assert llm.engine.remove_lora("gone") and not manager.failed
    fresh = llm.generate(prompt_ids[0], GREEDY, use_tqdm=False, lora_request=LoRARequest("gone", 1, str(gone)))
    assert tokens(fresh) == [hf["sql"][0]]
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert not llm.engine.has_unfinished_requests()


def test_an_adapter_changed_on_disk_is_not_read_again(smollm2_path, lora_adapters, tmp_path, prompt_ids):
    """A reload must read the weights the adapter was registered with: a rewritten file fails its requests."""
    changed = shutil.copytree(lora_adapters["poet"], tmp_path / "changed")
    other = shutil.copytree(lora_adapters["sql"], tmp_path / "other")
    llm = make_llm(smollm2_path, {"changed": changed, "other": other}, max_loras=1, max_cpu_loras=1)
    weights = changed / "adapter_model.safetensors"
    before = os.stat(weights).st_mtime_ns
    time.sleep(0.01)
    edit_tensors(changed, lambda t: t.update({k: v * 2 for k, v in t.items()}))
    assert os.stat(weights).st_mtime_ns != before
    out = llm.generate(prompt_ids[0], GREEDY, use_tqdm=False,
                       lora_request=llm.engine.lora_requests["changed"])[0].outputs[0]
    assert out.finish_reason == "abort" and out.token_ids == []
    assert out.stop_reason.startswith(f"LoRA adapter 'changed' ({changed}): adapter_config.json or "
                                      "adapter_model.safetensors changed since the adapter was loaded; ")


def test_max_cpu_loras_defaults_to_max_loras_and_may_not_be_below_it():
    assert LoRAConfig(max_loras=3).max_cpu_loras == 3 and LoRAConfig(max_loras=2, max_cpu_loras=5).max_cpu_loras == 5
    message = ("--max-cpu-loras must be at least --max-loras (2), got 1: the host cache holds every adapter of a "
               "batch; give --max-cpu-loras 2 or more, or leave it out (it defaults to --max-loras)")
    with pytest.raises(ConfigError) as info:
        LoRAConfig(max_loras=2, max_cpu_loras=1)
    assert str(info.value) == message
    with pytest.raises(ConfigError) as info:  # LLM(...) takes it as vLLM's LLM does
        config_from_kwargs("/nowhere", enable_lora=True, max_loras=2, max_cpu_loras=1)
    assert str(info.value) == message
    assert config_from_kwargs("/nowhere", enable_lora=True, max_cpu_loras=4).lora_config.max_cpu_loras == 4


def test_the_scheduler_aborts_the_requests_the_runner_could_not_run():
    """``ModelRunnerOutput.failures`` (not run): the request ends as aborted with the reason, its blocks go back,
    and a later report of it (an overlapped step) changes nothing."""
    from brigade.config import CacheConfig, SchedulerConfig
    from brigade.core.request import Request
    from brigade.core.scheduler import Scheduler
    from brigade.interfaces import FinishReason, ModelRunnerOutput, RequestFailure

    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64), CacheConfig(block_size=4),
                      max_model_len=64, num_blocks=32, lora_config=LoRAConfig())
    free = sched.kv_cache_manager.get_num_free_blocks()
    for rid, lora in (("ok", None), ("bad", "x")):
        params = SamplingParams(temperature=0, max_tokens=3)
        sched.add_request(Request(rid, [1, 2, 3, 4, 5], params, None, time.time(), lora_name=lora,
                                  lora_int_id=None if lora is None else 7, max_tokens=3))
    out = sched.schedule()
    assert set(out.num_scheduled_tokens) == {"ok", "bad"}
    failures = {"bad": RequestFailure("why", ran=False)}
    result = sched.update_from_output(out, ModelRunnerOutput(["ok"], [[9]], failures=failures))
    by_id = {o.request_id: o for o in result.outputs}
    assert by_id["bad"].finish_reason == FinishReason.ABORT and by_id["bad"].stop_reason == "why"
    assert by_id["ok"].new_token_ids == [9] and by_id["ok"].finish_reason is None
    assert set(sched.requests) == {"ok"} and "bad" in sched.finished_req_ids
    out = sched.schedule()
    again = sched.update_from_output(out, ModelRunnerOutput(["ok"], [[9]], failures=failures))
    assert [o.request_id for o in again.outputs] == ["ok"]
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sched.update_from_output(out, ModelRunnerOutput(list(out.num_scheduled_tokens),
                                                        [[9] for _ in out.num_scheduled_tokens]))
    assert sched.kv_cache_manager.get_num_free_blocks() == free
