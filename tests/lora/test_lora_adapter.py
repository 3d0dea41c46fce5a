"""Adapter loading and checks (brigade.lora.adapter), the delta of a slot mix (brigade.lora.layers), and the
scheduler's --max-loras rule: each bad adapter is one LoRAError line naming the adapter and the reason."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from lora_utils import KEY, edit_config, edit_tensors, write_adapter

from brigade.config import CacheConfig, LoRAConfig, SchedulerConfig
from brigade.core.request import Request
from brigade.core.scheduler import Scheduler
from brigade.interfaces import ModelRunnerOutput
from brigade.lora.adapter import LoRAError, load_adapter
from brigade.lora.layers import LoRABatch, LoRALinear
from brigade.sampling_params import SamplingParams


def test_a_good_adapter_loads_with_its_scaling(tmp_path, smollm2_config):
    path = write_adapter(tmp_path / "a", smollm2_config, seed=0, rank=4, alpha=8, targets=("q_proj", "down_proj"),
                         layers=[0, 3])
    adapter = load_adapter("a", str(path), smollm2_config, max_rank=16)
    assert adapter.rank == 4 and adapter.scaling == 2.0
    assert set(adapter.weights) == {(0, "q_proj"), (0, "down_proj"), (3, "q_proj"), (3, "down_proj")}
    a, b = adapter.weights[0, "down_proj"]
    assert a.shape == (4, smollm2_config.intermediate_size) and b.shape == (smollm2_config.hidden_size, 4)
    rs = write_adapter(tmp_path / "rs", smollm2_config, seed=0, rank=4, alpha=8, use_rslora=True)
    assert load_adapter("rs", str(rs), smollm2_config, max_rank=16).scaling == 8 / math.sqrt(4)


def test_a_config_without_lora_alpha_has_peft_default(tmp_path, smollm2_config):
    """PEFT's LoraConfig defaults lora_alpha to 8, so a hand-written config that leaves it out loads in PEFT with
    scaling 8 / r; Brigade gives the same (not 1, which r / r would be)."""
    path = write_adapter(tmp_path / "a", smollm2_config, seed=0, rank=4, alpha=16, targets=("q_proj",))
    cfg = json.loads((path / "adapter_config.json").read_text())
    del cfg["lora_alpha"]
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    assert load_adapter("a", str(path), smollm2_config, max_rank=16).scaling == 8 / 4


def test_peft_string_target_modules(tmp_path, smollm2_config):
    """PEFT also writes target_modules as a string: "all-linear", or a regex the module's full name matches."""
    for targets in ("all-linear", ".*\\.(q_proj|v_proj)", "model\\.layers\\.0\\.self_attn\\.(q|v)_proj"):
        path = write_adapter(tmp_path / f"s{len(targets)}", smollm2_config, seed=0, rank=8,
                             targets=("q_proj", "v_proj"), layers=[0])
        edit_config(path, target_modules=targets)
        adapter = load_adapter("s", str(path), smollm2_config, max_rank=16)
        assert adapter.target_modules == {"q_proj", "v_proj"}


@pytest.mark.parametrize("breakage,needle", [
    (lambda p: (p / "adapter_config.json").unlink(), "no adapter_config.json in the folder"),
    (lambda p: (p / "adapter_model.safetensors").rename(p / "adapter_model.bin"),
     "no adapter_model.safetensors in the folder (adapter_model.bin is not read; re-save with safetensors)"),
    (lambda p: edit_config(p, r=32), "rank 32 is above --max-lora-rank 16; raise --max-lora-rank to at least 32"),
    (lambda p: edit_config(p, target_modules=["q_proj", "embed_tokens"]),
     "target module 'embed_tokens' is not a projection of this model that LoRA can adapt"),
    (lambda p: edit_config(p, bias="lora_only"), "bias 'lora_only' is not supported (only 'none'"),
    (lambda p: edit_config(p, modules_to_save=["lm_head"]), "modules_to_save is not supported"),
    (lambda p: edit_config(p, use_dora=True), "use_dora is not supported"),
    (lambda p: edit_config(p, r="eight"), "'r' must be a positive integer, got 'eight'"),
    (lambda p: edit_tensors(p, lambda t: t.update({f"{KEY}.lora_A.weight": torch.zeros(8, 100)})),
     f"tensor '{KEY}.lora_A.weight' has shape [8, 100], expected [8, 576]"),
    (lambda p: edit_tensors(p, lambda t: t.pop(f"{KEY}.lora_B.weight")), "layer 0 q_proj has no lora_B weight"),
    (lambda p: edit_tensors(p, lambda t: t.update({
        "base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight": torch.zeros(8, 576),
        "base_model.model.model.layers.99.self_attn.q_proj.lora_B.weight": torch.zeros(576, 8)})),
     "is for layer 99, but the model has 30 layers"),
    (lambda p: edit_tensors(p, lambda t: t.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(8, 576)})),
     "tensor 'base_model.model.lm_head.lora_A.weight' is not a lora_A/lora_B weight of a projection"),
    (lambda p: edit_tensors(p, lambda t: t[f"{KEY}.lora_A.weight"].__setitem__((0, 0), float("nan"))),
     f"tensor '{KEY}.lora_A.weight' holds NaN or infinite values"),
    (lambda p: edit_tensors(p, lambda t: t[f"{KEY}.lora_B.weight"].__setitem__((3, 1), float("inf"))),
     f"tensor '{KEY}.lora_B.weight' holds NaN or infinite values"),
    (lambda p: edit_config(p, lora_alpha=float("nan")), "'lora_alpha' must be a finite number, got nan"),
    (lambda p: edit_config(p, lora_alpha=float("inf")), "'lora_alpha' must be a finite number, got inf"),
    (lambda p: edit_config(p, target_modules=".*\\.(q_proj"), "is not a valid regular expression"),
    (lambda p: edit_config(p, target_modules=".*\\.k_proj"),
     f"tensor '{KEY}.lora_A.weight' adapts a module that target_modules '.*\\\\.k_proj' does not match"),
    # Hostile or malformed files (each used to kill the engine on a runtime load)
    (lambda p: edit_config(p, target_modules=5), "'target_modules' must be a list of module names or a string"),
    (lambda p: edit_config(p, target_modules=[["q_proj"]]), "'target_modules' must be a list of module names"),
    (lambda p: edit_config(p, lora_alpha=10 ** 400), "'lora_alpha' must be a finite number"),
    (lambda p: (p / "adapter_config.json").write_text('{"r": ' + "9" * 5001 + "}"), "cannot read adapter_config.json"),
    (lambda p: (p / "adapter_config.json").write_text('{"x": ' + "[" * 200000 + "]" * 200000 + "}"),
     "cannot read adapter_config.json"),
    (lambda p: edit_config(p, peft_type="PROMPT_TUNING"), "peft_type is 'PROMPT_TUNING'; only LORA adapters"),
    (lambda p: edit_tensors(p, lambda t: t.update({f"{KEY}.lora_A.weight": t[f"{KEY}.lora_A.weight"].to(
        torch.float8_e4m3fn)})), "is torch.float8_e4m3fn; LoRA weights must be float32, float16 or bfloat16"),
    (lambda p: edit_tensors(p, lambda t: t.update({f"{KEY}.lora_A.weight": t[f"{KEY}.lora_A.weight"].to(
        torch.int32)})), "is torch.int32; LoRA weights must be"),
    (lambda p: edit_tensors(p, lambda t: t.update({
        "base_model.model.model.layers." + "9" * 5000 + ".self_attn.q_proj.lora_A.weight": torch.zeros(8, 576)})),
     "cannot be loaded: ValueError"),
])
def test_bad_adapters_fail_in_one_line(tmp_path, smollm2_config, breakage, needle):
    path = write_adapter(tmp_path / "bad", smollm2_config, seed=0, rank=8, targets=("q_proj", "v_proj"), layers=[0])
    breakage(path)
    with pytest.raises(LoRAError) as info:
        load_adapter("bad", str(path), smollm2_config, max_rank=16)
    message = str(info.value)
    assert message.startswith(f"LoRA adapter 'bad' ({path}): ") and needle in message and "\n" not in message


@pytest.mark.parametrize("field,value", [
    ("bias", "b" * 5000), ("use_dora", "d" * 5000), ("target_modules", ["q_proj", "m" * 5000]),
    ("target_modules", "(" + "r" * 5000),
])
def test_errors_echo_no_config_value_longer_than_200_characters(tmp_path, smollm2_config, field, value):
    path = write_adapter(tmp_path / "long", smollm2_config, seed=0, rank=8, targets=("q_proj", "v_proj"), layers=[0])
    edit_config(path, **{field: value})
    with pytest.raises(LoRAError) as info:
        load_adapter("long", str(path), smollm2_config, max_rank=16)
    message = str(info.value)
    assert message.startswith("LoRA adapter 'long'") and len(message) < 700, message[:300]
    assert not any(run * 201 in message for run in "bdmr")


def test_a_missing_folder(tmp_path, smollm2_config):
    with pytest.raises(LoRAError, match=r"LoRA adapter 'x' \(.*nowhere\): not a folder"):
        load_adapter("x", str(tmp_path / "nowhere"), smollm2_config, max_rank=16)


def test_slot_mix_equals_each_rows_own_adapter():
    """((x A_all^T) * mask) B_all^T is, row by row, scale * B_s A_s x for the row's slot s (zero-padded ranks,
    merged shards), and nothing for a row without a slot."""
    gen = torch.Generator().manual_seed(0)
    in_f, sizes, max_rank = 16, [12, 4, 4], 8
    batch = LoRABatch(16, 3, dtype=torch.float64, device=torch.device("cpu"))
    lora = LoRALinear(in_f, sizes, batch, max_rank=max_rank, dtype=torch.float64, device=torch.device("cpu"))
    adapters = {}
    for slot, rank in ((0, 8), (2, 3)):  # slot 1 stays empty
        shards = [(torch.randn(rank, in_f, generator=gen, dtype=torch.float64),
                   torch.randn(size, rank, generator=gen, dtype=torch.float64)) if j != 1 else None
                  for j, size in enumerate(sizes)]
        lora.set_slot(slot, shards, scaling=0.5)
        adapters[slot] = shards
    x = torch.randn(5, in_f, generator=gen, dtype=torch.float64)
    token_slots = [2, -1, 0, 2, 1]
    for t, s in enumerate(token_slots):
        if s >= 0:
            batch.mask[t, s] = 1
    got = lora.apply(x, torch.zeros(5, sum(sizes), dtype=torch.float64))
    for t, s in enumerate(token_slots):
        want = torch.zeros(sum(sizes), dtype=torch.float64)
        if s in adapters:
            want = torch.cat([0.5 * (b @ (a @ x[t])) if pair is not None else torch.zeros(size, dtype=torch.float64)
                              for pair, size in zip(adapters[s], sizes) for a, b in [pair or (None, None)]])
        torch.testing.assert_close(got[t], want)


def test_scheduler_never_runs_more_adapters_than_slots():
    """With max_loras 2, a waiting request of a third adapter waits while two run; requests behind it (base or
    a running adapter) still go; it runs once a slot's requests finish."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), CacheConfig(block_size=4),
                      max_model_len=128, num_blocks=64, lora_config=LoRAConfig(max_loras=2))
    for rid, lora, max_tokens in (("a", "x", 2), ("b", "y", 4), ("c", "z", 2), ("d", None, 2), ("e", "x", 2)):
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        sched.add_request(Request(rid, [1, 2, 3], params, None, time.time(), lora_name=lora,
                                  max_tokens=max_tokens))
    steps = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        steps.append(set(out.num_scheduled_tokens))
        assert len({sched.requests[r].lora_name for r in out.num_scheduled_tokens} - {None}) <= 2
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ModelRunnerOutput(ids, [[7] for _ in ids]))
    assert steps[0] == {"a", "b", "d", "e"}, "z waits; the base request and x's second request go"
    assert "c" in steps[2] and "c" not in steps[1], "z runs once x's requests have finished"


def test_a_config_with_a_byte_order_mark_loads(tmp_path, smollm2_config):
    path = write_adapter(tmp_path / "bom", smollm2_config, seed=0, rank=8, targets=("q_proj",), layers=[0])
    cfg = (path / "adapter_config.json").read_text()
    (path / "adapter_config.json").write_text("\ufeff" + cfg, encoding="utf-8")
    assert load_adapter("bom", str(path), smollm2_config, max_rank=16).rank == 8
