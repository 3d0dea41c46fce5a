"""What the offline ``LLM`` takes: vLLM's TextPrompt/TokensPrompt dicts in ``LLM.generate``, out-of-vocabulary token ids, and type errors that name the argument and what it takes.
One real SmolLM2 engine for the module; no mocks."""

from __future__ import annotations

import pytest

from brigade import LLM, SamplingParams
from brigade.sampling_params import InvalidParamError

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(str(smollm2_path), dtype="float32", max_model_len=64, block_size=16, max_num_seqs=4,
               num_gpu_blocks_override=32)


def _ids(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


# ---- 1: prompt dicts, out-of-vocabulary ids, bad prompt types -----------------------------------------------

def test_text_and_tokens_prompt_dicts_generate_as_their_str_and_ids(llm):
    ids = llm.get_tokenizer().encode("Hello")
    [plain] = llm.generate("Hello", GREEDY, use_tqdm=False)
    assert plain.prompt_token_ids == ids and len(plain.outputs[0].token_ids) == 4
    [text] = llm.generate({"prompt": "Hello"}, GREEDY, use_tqdm=False)
    [tokens] = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)
    assert text.prompt == "Hello" and text.prompt_token_ids == ids
    assert tokens.prompt_token_ids == ids
    assert _ids([text, tokens]) == _ids([plain]) * 2
    mixed = llm.generate(["Hello", {"prompt": "Hello"}, {"prompt_token_ids": ids}, ids,
                          {"prompt": "Hello", "cache_salt": "s"}], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in mixed] == [ids] * 5
    assert _ids(mixed) == _ids([plain]) * 5


def test_out_of_vocabulary_token_ids_are_a_value_error(llm):
    vocab = llm.engine.input_processor.vocab_size
    assert vocab == 49152  # SmolLM2's
    for prompts in ({"prompt_token_ids": [99999999]}, [{"prompt_token_ids": [1, -1]}], [[vocab]],
                    ["Hello", {"prompt_token_ids": [vocab]}]):
        with pytest.raises(ValueError, match=rf"prompt token ids must be in \[0, {vocab}\)"):
            llm.generate(prompts, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # nothing was left queued
    assert len(llm.generate({"prompt_token_ids": [vocab - 1]}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 4



def test_text_prompt_whose_tokens_outgrow_the_model_vocabulary_is_a_value_error(llm):
    """A tokenizer larger than the model's embedding (a tokenizer copied from another model): the text prompt's
    ids are checked as token-id prompts are, instead of failing the engine's step."""
    from brigade.engine.input_processor import InputProcessor
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode("The capital of France is")
    small = InputProcessor(tokenizer, max_model_len=64, vocab_size=max(ids))
    with pytest.raises(InvalidParamError, match=rf"prompt token ids must be in \[0, {max(ids)}\); got \[{max(ids)}\]"):
        small.tokenize("The capital of France is")
    assert InputProcessor(tokenizer, max_model_len=64, vocab_size=max(ids) + 1).tokenize("The capital of France is") \
        == ("The capital of France is", ids)

@pytest.mark.parametrize("prompts,needle", [
    (None, "got NoneType"),
    (5, "got int"),
    ([None], "prompts[0] must be"),
    (["a", 3.5], "prompts[1] must be"),
    ({"text": "hi"}, "unknown keys ['text']"),
    ({}, "neither 'prompt' nor 'prompt_token_ids'"),
    ({"prompt": 5}, "prompts['prompt'] must be a str"),
    ({"prompt_token_ids": "abc"}, "prompts['prompt_token_ids'] must be a list of int token ids"),
    ([{"prompt_token_ids": [1.5]}], "prompts[0]['prompt_token_ids'] must be a list of int token ids"),
    ([1, "a"], "prompts[0] must be"),
])
def test_other_prompt_types_are_a_type_error_naming_the_accepted_ones(llm, prompts, needle):
    with pytest.raises(TypeError) as info:
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert needle in str(info.value), str(info.value)
    if "unknown" in needle or "must be" in needle and "['" not in needle:
        assert '{"prompt": str} or {"prompt_token_ids": list[int]}' in str(info.value), str(info.value)


# ---- 5: type errors of the offline API ----------------------------------------------------------------------

def test_sampling_params_as_a_dict_is_a_type_error(llm):
    with pytest.raises(TypeError, match=r"sampling_params must be a SamplingParams or a list of them.*got dict "
                                        r"\(build it with SamplingParams\(\*\*params\)\)"):
        llm.generate(["a"], {"max_tokens": 2}, use_tqdm=False)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        llm.generate(["a"], [{"max_tokens": 2}], use_tqdm=False)


def test_chat_refuses_a_role_the_server_refuses(llm):
    with pytest.raises(InvalidParamError, match=r"messages\[1\]\.role must be one of system, developer, user, "
                                                r"assistant, tool, function; got 'wizard'"):
        llm.chat([{"role": "user", "content": "hi"}, {"role": "wizard", "content": "hi"}], GREEDY, use_tqdm=False)
    with pytest.raises(InvalidParamError, match=r"messages\[1\]\[0\]\.role .* got None"):
        llm.chat([[{"role": "user", "content": "hi"}], [{"content": "hi"}]], GREEDY, use_tqdm=False)
    [out] = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


def test_engine_arguments_of_the_wrong_type_name_the_argument(smollm2_path):
    with pytest.raises(TypeError, match="model must be the path of an HF-format model directory .*got NoneType"):
        LLM(None)
    with pytest.raises(TypeError, match=r"engine argument max_model_len must be int or None, got str 'abc'"):
        LLM(str(smollm2_path), max_model_len="abc")
    with pytest.raises(TypeError, match=r"engine argument enable_prefix_caching must be bool, got str 'yes'"):
        LLM(smollm2_path, enable_prefix_caching="yes")  # a Path is taken as the model


def test_sampling_params_stop_of_the_wrong_type_names_stop():
    with pytest.raises(InvalidParamError, match=r"stop must be a str or a list of str, got int 5") as info:
        SamplingParams(stop=5)
    assert info.value.param == "stop"
    with pytest.raises(InvalidParamError, match="stop_token_ids must be a list of int token ids"):
        SamplingParams(stop_token_ids=7)
    assert SamplingParams(stop="x").stop == ["x"] and SamplingParams(stop=["x", "y"]).stop == ["x", "y"]
