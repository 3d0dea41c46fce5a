"""Helpers for the sampler tests: build a batch's SamplingMetadata from plain parameters."""

from __future__ import annotations

import pytest
import torch

from brigade.sample import SamplingRequestState, build_sampling_metadata
from brigade.sampling_params import SamplingParams

CPU = torch.device("cpu")


def make_metadata(params: list[SamplingParams], *, vocab_size: int, outputs: list[list[int]] | None = None,
                  prompts: list[list[int]] | None = None, eos_token_id: int | None = None):
    """Rows with the given params; seeded params get a fresh generator seeded with params.seed."""
    outputs = outputs or [[] for _ in params]
    prompts = prompts or [[] for _ in params]
    reqs = []
    for p, out, prompt in zip(params, outputs, prompts):
        gen = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
        reqs.append(SamplingRequestState(params=p, prompt_token_ids=prompt, output_token_ids=out,
                                         generator=gen, eos_token_id=eos_token_id))
    return build_sampling_metadata(reqs, vocab_size=vocab_size, device=CPU)


@pytest.fixture
def metadata_for():
    return make_metadata
