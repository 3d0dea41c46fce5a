"""IO processors: plugins that turn a task-specific request body into prompts, and the finished outputs
into a task-specific response. They run in the API process only.

Selection: ``--io-processor-plugin NAME`` wins; otherwise the model's HF config may name one in an
``io_processor_plugin`` field; otherwise the model needs none.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from brigade.config import ModelConfig
    from brigade.interfaces import RequestOutput
    from brigade.plugins.registry import Registries
    from brigade.sampling_params import SamplingParams


@dataclass(slots=True)
class IOProcessorRequest:
    """What ``parse_request`` hands the engine: one request per prompt, all with the same params."""

    prompts: list[str | list[int]]  # text, or token ids
    sampling_params: SamplingParams


class IOProcessor(ABC):
    """A request/response translator for one task; instantiated once per server with the model config.

    Implementations must be stateless across requests (the server calls them concurrently).
    """

    def __init__(self, model_config: ModelConfig):
        self.model_config = model_config

    @abstractmethod
    def parse_request(self, data: Any) -> IOProcessorRequest:
        """Validate the plugin-specific body and build the prompts and sampling params.

        Raises:
            InvalidParamError: a field's value is wrong; the server answers 400 naming its ``param``.
            ValueError: the body is malformed; the server answers 400 with the message, naming ``data``.
        """

    @abstractmethod
    def post_process(self, request: IOProcessorRequest, outputs: list[RequestOutput]) -> dict[str, Any]:
        """Turn the finished outputs (one per prompt, same order) into the JSON response body."""


def io_processor_name(model_config: ModelConfig, hf_config: Any = None) -> str | None:
    """The IO processor this model uses: the CLI's choice, else the HF config's field, else None."""
    if model_config.io_processor_plugin:
        return model_config.io_processor_plugin
    return getattr(hf_config, "io_processor_plugin", None) or None


def get_io_processor(model_config: ModelConfig, registries: Registries, hf_config: Any = None
                     ) -> IOProcessor | None:
    """Instantiate the selected IO processor, or return None when the model needs none.

    Raises:
        UnknownNameError: the name is not registered (the message lists installed IO processors; call
            ``load_plugins("api")`` first).
        TypeError: the registered class is not an IOProcessor.
    """
    name = io_processor_name(model_config, hf_config)
    if name is None:
        return None
    cls = registries.io_processors.get(name)
    if not (isinstance(cls, type) and issubclass(cls, IOProcessor)):
        raise TypeError(f"IO processor {name!r} is {cls!r}, not an IOProcessor subclass")
    return cls(model_config)
