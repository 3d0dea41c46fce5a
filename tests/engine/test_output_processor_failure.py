"""OutputProcessor with SmolLM2's real tokenizer whose decoder also rewrites "Paris." as "Rome.": tokenizers'
DecodeStream raises on the token after " Paris." (the decoder is not prefix-stable). That request alone fails, each
of its sequences with finish_reason "error" and the message, and its engine ids come back to abort; the other
requests of the same steps are served as usual."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerFast

from brigade.engine.output_processor import OutputProcessor
from brigade.interfaces import EngineCoreOutput, FinishReason, RequestOutput
from brigade.sampling_params import RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def rewriting_tokenizer(smollm2_path):
    from tokenizers import Tokenizer

    spec = json.loads((smollm2_path / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Sequence", "decoders": [
        spec["decoder"], {"type": "Replace", "pattern": {"String": "Paris."}, "content": "Rome."}]}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))


def add(processor: OutputProcessor, tokenizer, request_id: str, prompt: str, n: int) -> list[RequestOutput]:
    sink: list[RequestOutput] = []
    params = SamplingParams(n=n, max_tokens=8, output_kind=RequestOutputKind.DELTA)
    processor.add_request(request_id, prompt, tokenizer(prompt)["input_ids"], params,
                          [f"{request_id}-{i}" for i in range(n)], 0.0, sink.append)
    return sink


def test_a_sequence_that_cannot_be_detokenized_fails_its_request_only(rewriting_tokenizer):
    processor = OutputProcessor(rewriting_tokenizer)
    failing = add(processor, rewriting_tokenizer, "paris", "The capital of France is", n=2)
    other = add(processor, rewriting_tokenizer, "count", "1, 2, 3,", n=1)
    paris = rewriting_tokenizer(" Paris. The", add_special_tokens=False)["input_ids"]
    count = rewriting_tokenizer(" 4, 5", add_special_tokens=False)["input_ids"]
    to_abort = []
    for step in range(3):
        outputs = [EngineCoreOutput(f"paris-{i}", [paris[step]]) for i in range(2)]
        outputs.insert(1, EngineCoreOutput("count-0", [count[step]]))
        to_abort += processor.process_outputs(outputs).reqs_to_abort
    assert sorted(to_abort) == ["paris-0", "paris-1"]
    final = failing[-1]
    assert final.finished and [c.finish_reason for c in final.outputs] == ["error", "error"]
    message = final.outputs[0].stop_reason
    assert "request paris failed while its output was detokenized" in message and "Invalid prefix" in message
    assert not any(o.finished for o in failing[:-1])
    num_failing_outputs = len(failing)  # a delta per sequence per step, then the one error output
    assert num_failing_outputs == 2 * 2 + 1
    # the other request got one output per step, text intact, and goes on to its end
    last = processor.process_outputs([EngineCoreOutput("count-0", [count[3]], finish_reason=FinishReason.LENGTH),
                                      EngineCoreOutput("paris-0", [1])])  # a late output of the failed request
    assert len(other) == 4 and "".join(o.outputs[0].text for o in other) == rewriting_tokenizer.decode(count[:4])
    assert other[-1].finished and other[-1].outputs[0].finish_reason == "length"
    assert last.reqs_to_abort == [] and len(failing) == num_failing_outputs  # the late output was dropped
    assert not processor.has_unfinished_requests()


def test_sequences_finishing_in_one_step_each_send_their_output(rewriting_tokenizer):
    processor = OutputProcessor(rewriting_tokenizer)
    sink = add(processor, rewriting_tokenizer, "pair", "1, 2, 3,", n=2)
    token = rewriting_tokenizer(" 4", add_special_tokens=False)["input_ids"][0]
    processor.process_outputs([EngineCoreOutput(f"pair-{i}", [token], finish_reason=FinishReason.LENGTH)
                               for i in range(2)])
    assert sorted(c.index for o in sink for c in o.outputs) == [0, 1]
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in sink)
