"""The sampler package: per-step sampling metadata, logits processors and the Sampler."""

from brigade.sample.logits_processors import (BUILTIN_LOGITS_PROCESSORS, LogitsProcessor,
                                              validate_logits_processor_params)
from brigade.sample.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs
from brigade.sample.metadata import SamplingMetadata, SamplingRequestState, build_sampling_metadata
from brigade.sample.sampler import Sampler, SamplerOutput

__all__ = [
    "BUILTIN_LOGITS_PROCESSORS", "LogitsProcessor", "validate_logits_processor_params",
    "LogprobsTensors", "compute_logprobs", "gather_logprobs",
    "SamplingMetadata", "SamplingRequestState", "build_sampling_metadata",
    "Sampler", "SamplerOutput",
]
