"""Speculative decoding: proposers of draft tokens. Verification is the model runner's
rejection sampler (``brigade.sample.rejection_sampler``)."""

from brigade.spec_decode.ngram import NgramProposer

__all__ = ["NgramProposer"]
