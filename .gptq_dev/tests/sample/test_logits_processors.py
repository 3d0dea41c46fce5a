"""Built-in logits processors: exact effects on the logits, and the front end's validation."""

import pytest
import torch

from brigade.sample.logits_processors import (BUILTIN_LOGITS_PROCESSORS, AllowedTokenIdsLogitsProcessor,
                                              BadWordsLogitsProcessor, LogitBiasLogitsProcessor,
                                              MinPLogitsProcessor, MinTokensLogitsProcessor,
                                              validate_logits_processor_params)
from brigade.sampling_params import InvalidParamError, SamplingParams

NEG_INF = float("-inf")


def masked(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(row == NEG_INF).flatten().tolist())


def test_builtins_registry_and_flags():
    assert list(BUILTIN_LOGITS_PROCESSORS) == ["allowed_token_ids", "bad_words", "logit_bias", "min_tokens",
                                               "min_p"]
    assert [c.is_argmax_invariant for c in BUILTIN_LOGITS_PROCESSORS.values()] == [False] * 4 + [True]


def test_logit_bias_adds_to_listed_tokens_only(metadata_for):
    md = metadata_for([SamplingParams(logit_bias={1: 2.5, 3: -100.0}), SamplingParams()], vocab_size=5)
    logits = torch.arange(10, dtype=torch.float32).reshape(2, 5)
    got = LogitBiasLogitsProcessor(md).apply(logits.clone())
    assert got.tolist() == [[0.0, 3.5, 2.0, -97.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0]]


@pytest.mark.parametrize("bias", [{7: 1.0}, {-1: 1.0}, {"x": 1.0}, {1: 101.0}, {1: float("nan")}])
def test_logit_bias_validation(bias):
    with pytest.raises(InvalidParamError) as err:
        LogitBiasLogitsProcessor.validate(SamplingParams(logit_bias=bias), vocab_size=7)
    assert err.value.param == "logit_bias"


def test_allowed_token_ids_masks_all_others(metadata_for):
    md = metadata_for([SamplingParams(), SamplingParams(allowed_token_ids=[0, 4])], vocab_size=6)
    got = AllowedTokenIdsLogitsProcessor(md).apply(torch.zeros(2, 6))
    assert masked(got[0]) == set() and masked(got[1]) == {1, 2, 3, 5}
    with pytest.raises(InvalidParamError) as err:
        validate_logits_processor_params(SamplingParams(allowed_token_ids=[6]), vocab_size=6)
    assert err.value.param == "allowed_token_ids"


def test_bad_words_single_and_multi_token(metadata_for):
    words = [[4], [1, 2], [1, 2, 3]]
    params = SamplingParams(bad_words=["x"], bad_words_token_ids=words)
    md = metadata_for([params, params, params, params], vocab_size=6,
                      outputs=[[], [0, 1], [5, 1, 2], [1, 2, 0]])
    got = BadWordsLogitsProcessor(md).apply(torch.zeros(4, 6))
    assert masked(got[0]) == {4}  # a single-token word is always masked
    assert masked(got[1]) == {4, 2}  # output ends with the prefix [1] of [1, 2]
    assert masked(got[2]) == {4, 3}  # ends with [1, 2], the prefix of [1, 2, 3]; [1, 2] is complete already
    assert masked(got[3]) == {4}  # the prefix is not at the end


def test_bad_words_validation():
    with pytest.raises(ValueError, match="tokenized"):
        BadWordsLogitsProcessor.validate(SamplingParams(bad_words=["x"]), vocab_size=5)
    with pytest.raises(InvalidParamError):
        BadWordsLogitsProcessor.validate(SamplingParams(bad_words=["x"], bad_words_token_ids=[[9]]), 5)


def test_min_tokens_masks_eos_and_stop_ids_until_reached(metadata_for):
    params = SamplingParams(min_tokens=2, stop_token_ids=[3])
    md = metadata_for([params, params, SamplingParams(min_tokens=5, ignore_eos=True)], vocab_size=5,
                      outputs=[[1], [1, 1], []], eos_token_id=0)
    got = MinTokensLogitsProcessor(md).apply(torch.zeros(3, 5))
    assert masked(got[0]) == {0, 3}
    assert masked(got[1]) == set()  # two outputs exist: EOS is allowed again
    assert masked(got[2]) == set()  # with ignore_eos, EOS is no stop token, so nothing to hold back


def test_min_p_keeps_tokens_above_fraction_of_top(metadata_for):
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]])
    md = metadata_for([SamplingParams(min_p=0.4), SamplingParams(temperature=0.0, min_p=0.9)], vocab_size=4)
    got = MinPLogitsProcessor(md).apply(probs.log())
    assert masked(got[0]) == {2, 3}  # below 0.4 * 0.5
    assert masked(got[1]) == set()  # greedy rows skip min_p
