"""SamplingParams.verify: offline users build SamplingParams directly, without the server's pydantic models,
so wrong types and non-finite numbers must fail at construction, naming the field, and never reach the
worker (a float seed there used to fail torch's manual_seed and leave the engine unusable)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from brigade.sampling_params import InvalidParamError, SamplingParams


@pytest.mark.parametrize("field,value", [
    ("seed", 1.5), ("seed", "x"), ("seed", True), ("top_k", 2.5), ("n", 2.0), ("max_tokens", "8"),
    ("logprobs", 1.0), ("temperature", "hot"), ("temperature", None), ("temperature", math.inf),
    ("temperature", math.nan), ("top_p", "0.5"), ("min_p", math.nan), ("repetition_penalty", math.inf),
    ("presence_penalty", False),
])
def test_wrong_types_and_non_finite_numbers_name_the_field(field, value):
    with pytest.raises(InvalidParamError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field and field in str(err.value)


@pytest.mark.parametrize("kwargs", [
    {"seed": 2 ** 63 - 1}, {"seed": np.int64(7)}, {"temperature": 0}, {"temperature": np.float32(0.5)},
    {"top_k": -1}, {"max_tokens": None}, {"logprobs": 0}, {"temperature": 1e300},
])
def test_accepted_values(kwargs):
    SamplingParams(**kwargs)
