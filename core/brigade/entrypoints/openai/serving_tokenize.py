"""POST /tokenize, POST /detokenize and GET /tokenizer_info: the server's tokenizer and chat template, as vLLM
exposes them."""

from __future__ import annotations

import math
from typing import Any

from brigade.entrypoints.openai.chat_template import refuse_request_chat_template
from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from brigade.entrypoints.openai.responses import DetokenizeResponse, TokenizeResponse
from brigade.entrypoints.openai.serving_chat import OpenAIServingChat


class OpenAIServingTokenization:
    """Tokenize a prompt (special tokens added by default) or chat messages (through the template), and
    detokenize ids. Shares the chat handler's renderer so both routes see the same prompt ids."""

    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        """Raises OpenAIError: 400 unless exactly one of prompt and messages is given, for a request chat_template
        and for chat_template_kwargs a chat request could not send either, or on a server without a tokenizer; 404
        for the model."""
        await self.chat.check_request(request)
        refuse_request_chat_template(request.chat_template)
        if (request.prompt is None) == (request.messages is None):
            raise OpenAIError.bad_param("give exactly one of prompt and messages", "prompt")
        if request.messages is not None:
            self.chat.check_generation_prompt(request)
            token_ids = await self.chat.render_messages(request.messages,
                                                        add_generation_prompt=request.add_generation_prompt,
                                                        continue_final_message=request.continue_final_message,
                                                        add_special_tokens=bool(request.add_special_tokens),
                                                        template_kwargs=request.chat_template_kwargs)
        else:
            add_special = True if request.add_special_tokens is None else request.add_special_tokens
            token_ids = await self.chat.tokenize(request.prompt, add_special_tokens=add_special)
        strs = self.chat.tokenizer.convert_ids_to_tokens(token_ids) if request.return_token_strs else None
        return TokenizeResponse(count=len(token_ids), max_model_len=self.chat.max_model_len, tokens=token_ids,
                                token_strs=strs)

    async def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        """Raises OpenAIError: 400 for ids outside the vocabulary or a server without a tokenizer; 404 for the
        model."""
        await self.chat.check_request(request)
        self.chat.check_token_ids(request.tokens, "tokens")
        self.chat.require_tokenizer("/detokenize", "tokens", "it cannot turn ids into text")
        text = await self.chat.run_tokenizer(self.chat.tokenizer.decode, request.tokens)
        return DetokenizeResponse(prompt=text)

    def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's /tokenizer_info body: the tokenizer's init kwargs (its tokenizer_config.json as loaded: special
        tokens as their text, ``model_max_length``, ``added_tokens_decoder`` ...) less the fields that name files,
        plus ``tokenizer_class`` (the loaded class's name) and ``chat_template`` (the template chat requests are
        rendered with: ``--chat-template`` if given, else the tokenizer's; absent when there is none).

        Raises:
            OpenAIError: 400 on a server without a tokenizer.
        """
        self.chat.require_tokenizer("/tokenizer_info", None, "this server only takes and returns token ids")
        tokenizer = self.chat.tokenizer
        config = {key: _json_value(value) for key, value in (getattr(tokenizer, "init_kwargs", None) or {}).items()
                  if not key.endswith("_file")}  # vocab_file, merges_file, tokenizer_file: paths on the server
        config["tokenizer_class"] = type(tokenizer).__name__
        template = self.chat.chat_template or getattr(tokenizer, "chat_template", None)
        if isinstance(template, str) and template:
            config["chat_template"] = template
        else:
            config.pop("chat_template", None)
        return config


def _json_value(value: Any) -> Any:
    """``value`` as JSON can carry it: an AddedToken as its text (vLLM does the same), containers element-wise,
    dict keys as strings, anything else that JSON has no type for as its ``str``."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_value(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf or nan
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)

