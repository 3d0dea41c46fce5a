"""The scheduler's policy objects on their own: each decides from its arguments and its own state only."""

from __future__ import annotations

import time

import pytest

from brigade.config import SpeculativeConfig
from brigade.core.external_kv import ExternalKV
from brigade.core.grammar_gate import GrammarGate, GrammarVerdict
from brigade.core.lora_admission import LoRAAdmission
from brigade.core.prompt_logprobs import PromptLogprobsLedger
from brigade.core.request import Request
from brigade.core.request_queue import FcfsQueue, PriorityQueue
from brigade.core.spec_drafts import SpecDrafts
from brigade.interfaces import LogprobsLists
from brigade.sampling_params import SamplingParams


def make_request(rid, prompt=(1, 2, 3, 4), max_tokens=8, lora=None, priority=0, arrival=None, **kw):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
    return Request(rid, list(prompt), params, 0, time.time() if arrival is None else arrival, priority=priority,
                   lora_name=lora, lora_int_id=None if lora is None else hash(lora) % 1000, max_tokens=max_tokens)


def test_lora_admission_counts_distinct_adapters_of_the_batch():
    admission = LoRAAdmission(max_loras=2)
    admission.start_step([make_request("r", lora="a"), make_request("s", lora="a"), make_request("t")])
    b, c = make_request("b", lora="b"), make_request("c", lora="c")
    assert admission.may_admit(make_request("a2", lora="a")) and admission.may_admit(b)
    admission.admitted(b)
    assert not admission.may_admit(c), "a and b hold both slots"
    assert admission.may_admit(make_request("base")), "the base model needs no slot"
    assert LoRAAdmission(None).may_admit(c), "no limit without LoRA"


def test_spec_drafts_fit_the_token_limit_and_max_tokens():
    drafts = SpecDrafts(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=2, prompt_lookup_min=1),
                        max_model_len=256)
    request = make_request("a", max_tokens=4)
    request.append_output_token_ids([9])
    request.num_computed_tokens = request.num_tokens - 1  # a decode with its last token known
    request.spec_token_ids = [5, 6, 7, 8]
    assert drafts.schedulable(request, token_limit=64) == [5, 6], "3 tokens left: at most 2 drafts + 1"
    assert drafts.schedulable(request, token_limit=2) == [5], "the decode token and one draft fit 2"
    assert drafts.num_rejected(num_drafts=2, num_tokens=2) == 1
    stats = drafts.take_stats()
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 2, 1)
    assert drafts.take_stats().num_drafts == 0, "counters reset on take"
    assert SpecDrafts(None, 256).propose(request) == [] and SpecDrafts(None, 256).take_stats() is None


def test_external_kv_without_connector_supplies_nothing():
    external = ExternalKV(None)
    request = make_request("a")
    assert external.num_matched_tokens(request, 0) == 0 and external.metadata(None) is None
    external.allocated(request, [1], 0)
    external.check_finished(request, [1])
    assert external.num_external_tokens_total == 0


def test_grammar_gate_without_manager_holds_nothing_back():
    gate = GrammarGate(None)
    request = make_request("a")
    assert not gate.is_compiling("a") and gate.take_failure("a") is None
    assert gate.bitmask_req_ids([(request, 4)]) == []
    assert gate.advance("a", [1]) is GrammarVerdict.CONTINUE


def test_prompt_logprobs_ledger_sends_each_row_once():
    ledger = PromptLogprobsLedger()
    rows = LogprobsLists([[1], [2], [3]], [[-0.1], [-0.2], [-0.3]], [1, 1, 1])
    assert ledger.take_new("a", 1, rows).ranks == [1, 1, 1]  # rows of tokens 1..3
    assert ledger.take_new("a", 1, rows) is None, "recomputed after preemption: all delivered"
    more = LogprobsLists([[3], [4]], [[-0.3], [-0.4]], [1, 2])
    assert ledger.take_new("a", 3, more).ranks == [2], "token 3's row was out, token 4's is new"


@pytest.mark.parametrize("queue, expected", [(FcfsQueue, "c"), (PriorityQueue, "a")])
def test_victim_index(queue, expected):
    running = [make_request("a", priority=2, arrival=1.0), make_request("b", priority=0, arrival=2.0),
               make_request("c", priority=1, arrival=3.0)]
    assert running[queue.victim_index(running)].request_id == expected
