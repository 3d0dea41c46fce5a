"""Sampling with penalties, bad words and min_tokens under overlapped scheduling on a CUDA device: building the
step's sampling state (its in-flight tokens read on the device) and running the sampler never make the host wait
for the stream, and the result is the one the tokens on the host give. Skipped as a whole without CUDA (CI); run on
the H200 with ``pytest tests/cuda``."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from brigade.sample.metadata import PendingTokens, SamplingRequestState, build_sampling_metadata  # noqa: E402
from brigade.sample.sampler import Sampler  # noqa: E402
from brigade.sampling_params import SamplingParams  # noqa: E402

VOCAB = 4096


def rows(device: torch.device) -> list[SamplingRequestState]:
    made = [SamplingParams(temperature=0.0, repetition_penalty=1.5),
            SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=1.0),
            SamplingParams(temperature=0.0, min_tokens=8, bad_words_token_ids=[[5, 7], [9]])]
    return [SamplingRequestState(params=p, prompt_token_ids=[1, 2, 3], output_token_ids=[4, 5], generator=None,
                                 eos_token_id=0) for p in made]


def test_overlapped_sampling_state_does_not_wait_for_the_stream_and_matches_the_host_tokens():
    device = torch.device("cuda")
    logits = torch.randn(3, VOCAB, device=device, generator=torch.Generator(device).manual_seed(0))
    # row 1: token 5 wins with one 5 in the output (7 - 1 - 1 = 5 > 4.5), token 6 with the in-flight 5 as well
    logits[1, 5], logits[1, 6] = 7.0, 4.5
    logits[2, 7] = 10.0  # row 2: masked only because the in-flight 5 starts the bad word [5, 7]
    pending = PendingTokens(torch.tensor([5, 5, 5], device=device), [0, 1, 2])  # the in-flight token: 5
    sampler = Sampler()
    sampler(logits.clone(), build_sampling_metadata(rows(device), vocab_size=VOCAB, device=device, pending=pending))
    torch.cuda.synchronize()  # warm: pinned pool, kernels
    torch.cuda.set_sync_debug_mode("error")  # any call that would make the host wait for the stream raises
    try:
        metadata = build_sampling_metadata(rows(device), vocab_size=VOCAB, device=device, pending=pending)
        out = sampler(logits.clone(), metadata)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    # the same step with the in-flight token already on the host
    on_host = rows(device)
    for state in on_host:
        state.output_token_ids.append(5)
    want = sampler(logits.clone(), build_sampling_metadata(on_host, vocab_size=VOCAB, device=device))
    assert out.sampled_token_ids.tolist() == want.sampled_token_ids.tolist()
    assert out.sampled_token_ids[1].item() == 6 and out.sampled_token_ids[2].item() != 7
