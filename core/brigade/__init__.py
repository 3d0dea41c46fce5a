"""Brigade: a plugin-driven LLM inference and serving engine in the design of vLLM v1."""

from brigade.version import __version__
from brigade.sampling_params import SamplingParams, StructuredOutputsParams
from brigade.interfaces import CompletionOutput, RequestOutput


def __getattr__(name: str):
    # LLM pulls in torch and the engine; import it lazily so `import brigade` stays cheap.
    if name == "LLM":
        from brigade.entrypoints.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput",
           "__version__"]
