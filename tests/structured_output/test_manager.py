"""StructuredOutputManager and the scheduler's grammar hooks, on SmolLM2's real tokenizer.

No model runs here: the tests play the model runner by sampling from the scheduler's bitmask, so they
check what the engine relies on (which tokens the bitmask allows, when a request waits for its compile,
when a grammar ends a request) in well under a second per test.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from transformers import AutoConfig, AutoTokenizer

from brigade.config import CacheConfig, SchedulerConfig
from brigade.core.request import Request, RequestStatus
from brigade.core.scheduler import Scheduler
from brigade.core.scheduler_output import ModelRunnerOutput
from brigade.engine.messages import FinishReason
from brigade.sampling_params import InvalidParamError, SamplingParams, StructuredOutputsParams
from brigade.structured_output import GrammarSpec, StructuredOutputManager, validate_structured_outputs


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(str(smollm2_path))


@pytest.fixture(scope="module")
def vocab_size(smollm2_path) -> int:
    return AutoConfig.from_pretrained(str(smollm2_path)).vocab_size


@pytest.fixture
def manager(tokenizer, vocab_size):
    mgr = StructuredOutputManager(lambda: tokenizer, vocab_size, [tokenizer.eos_token_id], max_workers=1)
    yield mgr
    mgr.shutdown()


def allowed(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids whose bit is set in one bitmask row."""
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def wait_ready(manager, request_id, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while manager.is_waiting_for_grammar(request_id):
        assert time.monotonic() < deadline, "grammar never compiled"
        manager.wait_for_compiles(0.1)


# ---- spec ----------------------------------------------------------------------------------------

def test_spec_is_canonical_so_equal_schemas_share_a_compile():
    a = GrammarSpec.from_params(StructuredOutputsParams(json={"type": "object", "required": ["x"]}))
    b = GrammarSpec.from_params(StructuredOutputsParams(json='{"required": ["x"],  "type": "object"}'))
    assert a == b and hash(a) == hash(b) and a.kind == "json"
    assert GrammarSpec.from_params(StructuredOutputsParams(json=True)).kind == "json_object"
    assert GrammarSpec.from_params(StructuredOutputsParams(choice=["a", "b", "a"])).text == '["a", "b"]'


@pytest.mark.parametrize("params,fragment", [
    (StructuredOutputsParams(regex="[a-"), "regex"),
    (StructuredOutputsParams(json={"type": "foo"}), "json"),
    (StructuredOutputsParams(json="{not json"), "not valid JSON"),
    (StructuredOutputsParams(json=[1, 2]), "must be an object"),
    (StructuredOutputsParams(grammar='root ::= undefined_rule'), "grammar"),
    (StructuredOutputsParams(choice=[]), "non-empty"),
    (StructuredOutputsParams(regex="a", grammar='root ::= "a"'), "exactly one"),
])
def test_front_end_validation_names_the_field(params, fragment):
    with pytest.raises(InvalidParamError) as info:
        validate_structured_outputs(params, param="response_format")
    assert info.value.param == "response_format" and fragment in str(info.value)
    assert "/project/" not in str(info.value)  # xgrammar's C++ source location is stripped


# ---- manager -------------------------------------------------------------------------------------

def test_choice_bitmask_then_accept_until_terminated(manager, tokenizer, vocab_size):
    manager.add_request("r", StructuredOutputsParams(choice=["yes", "no"]))
    wait_ready(manager, "r")
    mask = manager.grammar_bitmask(["r"])
    assert mask.shape == (1, -(-vocab_size // 32)) and mask.dtype == np.int32
    first = set(allowed(mask[0], vocab_size).tolist())
    for word in ("yes", "no"):
        assert tokenizer.encode(word)[0] in first
    assert tokenizer.eos_token_id not in first  # the grammar cannot end before a choice is complete
    assert tokenizer.encode("maybe")[0] not in first
    assert manager.accept_tokens("r", tokenizer.encode("yes"))
    done = allowed(manager.grammar_bitmask(["r"])[0], vocab_size).tolist()
    assert done == [tokenizer.eos_token_id]  # only the stop token remains
    assert not manager.is_terminated("r")
    assert manager.accept_tokens("r", [tokenizer.eos_token_id]) and manager.is_terminated("r")


def test_rejected_token_and_compile_cache(manager, tokenizer):
    params = StructuredOutputsParams(regex=r"[0-9]{3}")
    manager.add_request("a", params)
    manager.add_request("b", params)
    assert manager._requests["a"].future is manager._requests["b"].future  # one compile for both
    wait_ready(manager, "a")
    assert not manager.accept_tokens("a", tokenizer.encode("x"))
    assert manager.accept_tokens("b", tokenizer.encode("1"))  # b's matcher is its own
    manager.remove_request("a")
    assert not manager.has_request("a") and manager.has_request("b")


def test_compile_failure_is_reported_not_raised(manager):
    manager.add_request("bad", StructuredOutputsParams(grammar="root ::= nope"))
    deadline = time.monotonic() + 30
    while manager.is_waiting_for_grammar("bad"):
        assert time.monotonic() < deadline
        manager.wait_for_compiles(0.1)
    error = manager.take_failure("bad")
    assert error is not None and "nope" in error and not manager.has_request("bad")


# ---- scheduler hooks -----------------------------------------------------------------------------

def make_scheduler(manager, num_blocks=64, budget=64):
    return Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget),
                     CacheConfig(block_size=4, enable_prefix_caching=False), max_model_len=256,
                     num_blocks=num_blocks, structured_output_manager=manager)


def make_request(rid, prompt, eos, max_tokens=16, **kw):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
    return Request(rid, list(prompt), params, eos, time.time(), max_tokens=max_tokens)


def step(sched, vocab_size, choose):
    """One step; each sampling request gets ``choose(rid, allowed ids or None)``."""
    out = sched.schedule()
    rows = {rid: i for i, rid in enumerate(out.structured_output_req_ids)}
    ids, sampled = list(out.num_scheduled_tokens), []
    for rid in ids:
        req = sched.requests[rid]
        if req.num_computed_tokens < req.num_tokens:
            sampled.append([])
            continue
        ok = allowed(out.grammar_bitmask[rows[rid]], vocab_size) if rid in rows else None
        sampled.append([choose(rid, ok)])
    return out, sched.update_from_output(out, ModelRunnerOutput(ids, sampled))


def test_request_waits_for_its_compile_while_others_run(manager, tokenizer, vocab_size):
    gate = threading.Event()
    real_compile = manager._compile
    manager._compile = lambda spec: (gate.wait(30), real_compile(spec))[1]  # hold the compile back
    sched = make_scheduler(manager)
    eos = tokenizer.eos_token_id
    sched.add_request(make_request("s", range(1, 6), eos, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"])))
    sched.add_request(make_request("p", range(10, 15), eos, max_tokens=3))
    out, _ = step(sched, vocab_size, lambda rid, ok: 7)
    assert list(out.num_scheduled_tokens) == ["p"] and out.grammar_bitmask is None
    assert [r.request_id for r in sched.waiting] == ["s"]
    gate.set()
    wait_ready(manager, "s")
    yes = tokenizer.encode("yes")
    texts: dict[str, list[int]] = {"s": []}

    def choose(rid, ok):
        if ok is None:
            return 7
        token = yes[len(texts[rid])] if len(texts[rid]) < len(yes) else int(ok[0])
        assert token in ok
        texts[rid].append(token)
        return token

    out, _ = step(sched, vocab_size, choose)
    assert out.structured_output_req_ids == ["s"] and out.grammar_bitmask.shape[0] == 1
    finish = None
    for _ in range(10):
        if "s" not in sched.requests:
            break
        _, outputs = step(sched, vocab_size, choose)
        finish = next((o.finish_reason for o in outputs.outputs if o.request_id == "s"), finish)
    assert tokenizer.decode(texts["s"], skip_special_tokens=True) == "yes" and texts["s"][-1] == eos
    assert finish == FinishReason.STOP and not manager.has_request("s")


def test_grammar_end_stops_request_even_with_ignore_eos(manager, tokenizer, vocab_size):
    sched = make_scheduler(manager)
    sched.add_request(make_request("s", range(1, 6), tokenizer.eos_token_id, ignore_eos=True,
                                   structured_outputs=StructuredOutputsParams(regex="ab")))
    wait_ready(manager, "s")
    finishes = []
    for _ in range(10):
        if not sched.requests:
            break
        _, outputs = step(sched, vocab_size, lambda rid, ok: int(ok[0]))
        finishes += [o.finish_reason for o in outputs.outputs]
    assert finishes[-1] == FinishReason.STOP and len(finishes) <= 3  # "a", "b" (or "ab"), then EOS


def test_failed_compile_finishes_request_as_aborted(manager, tokenizer, vocab_size):
    sched = make_scheduler(manager)
    sched.add_request(make_request("bad", range(1, 6), tokenizer.eos_token_id,
                                   structured_outputs=StructuredOutputsParams(grammar="root ::= nope")))
    deadline = time.monotonic() + 30
    outputs = []
    while not outputs:
        assert time.monotonic() < deadline
        manager.wait_for_compiles(0.1)
        _, result = step(sched, vocab_size, lambda rid, ok: 7)
        outputs = result.outputs
    assert outputs[0].finish_reason == FinishReason.ABORT and "nope" in outputs[0].stop_reason
    assert not sched.requests and sched.kv_cache_manager.get_num_free_blocks() == 63


def test_preempted_request_keeps_its_grammar_state(manager, tokenizer, vocab_size):
    # 6 usable blocks of 4 tokens: two 8-token prompts growing by 12 tokens cannot both fit.
    sched = make_scheduler(manager, num_blocks=7)
    eos = tokenizer.eos_token_id
    digits = StructuredOutputsParams(regex="[0-9]{10}")
    for rid, start in (("a", 1), ("b", 100)):
        sched.add_request(make_request(rid, range(start, start + 8), eos, max_tokens=12, structured_outputs=digits))
    wait_ready(manager, "a")
    wait_ready(manager, "b")
    preempted = set()
    produced: dict[str, list[int]] = {"a": [], "b": []}

    def choose(rid, ok):
        produced[rid].append(int(ok[-1]))
        return produced[rid][-1]

    for _ in range(60):
        if not sched.requests:
            break
        out, _ = step(sched, vocab_size, choose)
        preempted |= out.preempted_req_ids
    assert preempted, "the pool is too small for both requests"
    for rid in ("a", "b"):
        text = tokenizer.decode(produced[rid], skip_special_tokens=True)
        # Ten digits exactly, then EOS: a matcher re-fed after recompute would have ended early or failed.
        assert len(text) == 10 and text.isdigit() and produced[rid][-1] == eos, (rid, text)
    assert sched.kv_cache_manager.get_num_free_blocks() == 6
