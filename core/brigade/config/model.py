"""ModelConfig: which model, its dtype and tokenizer, and the names it is served under."""

from __future__ import annotations

import os
from dataclasses import dataclass

from brigade.config.errors import ConfigError


_DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float", "bf16", "fp16", "fp32")


@dataclass
class ModelConfig:
    """What model to run and how its weights and tokenizer are read."""

    model: str = ""
    """Path of an HF-format directory (config.json, *.safetensors, tokenizer.json)."""
    tokenizer: str | None = None
    """Tokenizer directory; defaults to model."""
    served_model_name: str | list[str] | None = None
    """The name clients use, or several (vLLM's ``--served-model-name a b``): each is accepted as ``model`` and
    listed by /v1/models, the first is the one responses and metrics carry. Defaults to the model path's
    basename."""
    dtype: str = "auto"
    """auto (the config's torch_dtype on GPU, float32 on CPU), bfloat16, float16 or float32."""
    max_model_len: int | None = None
    """Longest prompt plus output, in tokens; defaults to the config's max_position_embeddings."""
    seed: int = 0
    """Seed for dummy weights and unseeded random sampling."""
    load_format: str = "auto"
    """auto, safetensors, gguf or dummy (random weights from config.json alone)."""
    generation_config: str = "auto"
    """auto reads generation_config.json defaults; none ignores it; or a directory."""
    chat_template: str | None = None
    """A Jinja chat template (text or file) to use instead of the tokenizer's."""
    quantization: str | None = None
    """A quantization method name registered by a plugin."""
    enforce_eager: bool = False
    """Never capture CUDA graphs."""
    io_processor_plugin: str | None = None
    """Name of an IO-processor plugin to apply to requests and outputs."""
    skip_tokenizer_init: bool = False
    """Load no tokenizer: prompts must be token ids and outputs carry no text (dummy-weight benchmarks)."""
    trust_remote_code: bool = False
    """Let transformers run the model folder's own code (``auto_map``) to read its config and tokenizer."""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r} is not known; use one of auto, bfloat16, float16, float32")
        if self.load_format not in ("auto", "safetensors", "gguf", "dummy"):
            raise ConfigError(f"--load-format {self.load_format!r} is not known; use auto, safetensors, gguf or dummy")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"--max-model-len must be a positive integer, got {self.max_model_len}")

    @property
    def name(self) -> str:
        """The served model's (first) name: what responses and metrics carry."""
        return self.served_model_names[0]

    @property
    def served_model_names(self) -> list[str]:
        """Every name the model is served under, the first being ``name``."""
        names = self.served_model_name
        if isinstance(names, str):
            names = [names]
        names = list(dict.fromkeys(n for n in names or () if n))  # in order, each once
        return names or [os.path.basename(os.path.normpath(self.model)) or self.model]
