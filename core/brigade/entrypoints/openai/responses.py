"""Response bodies and stream chunks of the OpenAI-compatible API, as pydantic models."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer


class ErrorInfo(BaseModel):
    """OpenAI's error object: message, type (e.g. invalid_request_error), param (the bad field), code."""

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """Every error body, and the one error chunk of a failed stream: {"error": {...}}."""

    error: ErrorInfo


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""


class UsageInfo(BaseModel):
    """Token counts of a whole request: prompt_tokens sums over prompts, completion_tokens over choices."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def from_counts(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> "UsageInfo":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


# ---- /v1/completions -------------------------------------------------------------------------------

class CompletionLogprobs(BaseModel):
    """The legacy completions logprobs object: one entry per token, parallel lists.

    text_offset[i] is the character offset in the choice's text where tokens[i]'s text starts (a token holding
    part of a character starts at that character; text_offsets.py), never decreasing; top_logprobs[i] maps a
    candidate's text to its logprob (None for the first prompt token under echo, which has no logprob).
    """

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's prompt_logprobs entry for one candidate token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    # vLLM's extra: per prompt token, None for the first, else {token id: PromptLogprob}; only when asked.
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # vLLM's extras with return_token_ids: the prompt's ids (a stream: in the choice's first chunk) and the
    # generated ids (a stream: the chunk's new ones).
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


# ---- /v1/chat/completions --------------------------------------------------------------------------

class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatLogprobToken] | None = None


class FunctionCall(BaseModel):
    """A function call: the function's name and its arguments as a JSON text (OpenAI's shape)."""

    name: str
    arguments: str


class ToolCall(BaseModel):
    """One tool call of an assistant message; ``id`` is what a later ``tool`` message answers."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's extra with return_token_ids: the generated ids


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    # vLLM's extra, as a completion choice's: per prompt token, None for the first, else {token id: PromptLogprob}.
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's extra with return_token_ids


class _DropNone(BaseModel):
    """Serialized without its None fields, as OpenAI's stream deltas are."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaFunctionCall(_DropNone):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_DropNone):
    """A piece of tool call ``index``: the first piece carries id, type and name; later ones more arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    """A stream delta; unset fields are left out (OpenAI sends ``role`` only in the first chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's extra with return_token_ids: this chunk's new ids


class ChatCompletionStreamResponse(BaseModel):
    """One chat.completion.chunk; ``usage`` is null on every chunk but the final usage chunk."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's extra with return_token_ids: in the first chunk


class CompletionStreamResponse(BaseModel):
    """One text_completion chunk; ``usage`` as for chat chunks."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


# ---- models, tokenizer -----------------------------------------------------------------------------

class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "brigade"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str
