"""Tokenizer loading and chat templates, through transformers (never fetched from a hub)."""

from __future__ import annotations

import os

from brigade.config import ConfigError, ModelConfig


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")
"""Files of which a folder needs one (or a ``*.tiktoken`` file) for transformers to find a tokenizer there."""


def check_model_has_tokenizer(model: str) -> None:
    """A model folder used as its own tokenizer must hold tokenizer files; else transformers fails with a long
    message about sentencepiece and tiktoken. A path that is not a folder (a GGUF file) is not looked at.

    Raises:
        ConfigError: one line naming the folder, the files and the two ways out (--tokenizer, --skip-tokenizer-init).
    """
    if not os.path.isdir(model):
        return
    try:
        names = os.listdir(model)
    except OSError:
        return  # the loaders report an unreadable folder themselves
    if not any(name in TOKENIZER_FILES or name.endswith((".tiktoken", ".gguf")) for name in names):
        raise ConfigError(f"the model folder {model!r} has no tokenizer (tokenizer.json / tokenizer_config.json); "
                          "give one with --tokenizer DIR (tokenizer= offline), or pass --skip-tokenizer-init "
                          "(skip_tokenizer_init=True) to send token ids only")


def get_tokenizer(model_config: ModelConfig):
    """Load the model's fast tokenizer from its directory (None with ``skip_tokenizer_init``).

    Raises:
        ConfigError (a ValueError): when the directory has no usable tokenizer.
    """
    from transformers import AutoTokenizer

    if model_config.skip_tokenizer_init:
        return None
    path = model_config.tokenizer or model_config.model
    if model_config.tokenizer is None:
        check_model_has_tokenizer(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True,
                                                  trust_remote_code=model_config.trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, or KeyError/TypeError on a broken file
        detail = str(exc) if isinstance(exc, (OSError, ValueError)) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"cannot load a tokenizer from {path!r}: {detail}") from exc
    # The engine checks lengths against --max-model-len itself (a 400 naming the limit); without this,
    # transformers logs "Token indices sequence length is longer than ... will result in indexing errors"
    # for every too-long prompt it encodes, an alarm about a request that is refused cleanly anyway.
    tokenizer.model_max_length = int(1e30)
    if model_config.chat_template is not None:
        tokenizer.chat_template = chat_template_text(model_config.chat_template)
    return tokenizer


def chat_template_text(template: str) -> str:
    """A ``--chat-template`` value as template text: the file's contents when it names a file, else itself.

    Raises:
        OSError, UnicodeDecodeError: the file cannot be read as UTF-8.
    """
    if os.path.isfile(template):
        with open(template, encoding="utf-8") as f:
            return f.read()
    return template


def apply_chat_template(tokenizer, messages: list[dict], *, add_generation_prompt: bool = True,
                        tools: list[dict] | None = None, chat_template: str | None = None,
                        continue_final_message: bool = False) -> str:
    """Render a conversation to the prompt text with the tokenizer's (or the given) Jinja template.

    Raises:
        ValueError: the model has no chat template and none was given.
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model has no chat template; pass --chat-template")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         tools=tools, chat_template=chat_template,
                                         continue_final_message=continue_final_message)
