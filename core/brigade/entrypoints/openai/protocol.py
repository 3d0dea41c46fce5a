"""Request bodies of the OpenAI-compatible API, as pydantic models (OpenAI fields plus vLLM's extras).

The field names follow OpenAI's reference and vLLM's extra sampling parameters, so that OpenAI
SDK clients and vLLM clients send the same bodies here. Unknown fields are kept in ``model_extra`` so the
server can warn about them instead of rejecting the request (vLLM's behaviour).

Range checks live in SamplingParams.verify, which names the bad field; these models only check types.
Booleans are strict, as in OpenAI: only JSON ``true``/``false``, never ``"yes"``, ``"true"`` or ``1``.
Numbers are strict too: an integer field takes only a JSON integer (not ``"5"``, ``5.0`` or ``true``) and a
number field (``Number``) a JSON integer or decimal, finite (not ``"0.5"``, ``true``, ``NaN`` or ``Infinity``).
A message's ``role`` is one of CHAT_ROLES.
A field OpenAI declares nullable (``n``, ``stream``, ``echo``, chat ``logprobs``...) takes ``null`` as its default,
as OpenAI and vLLM do (NULL_IS_DEFAULT).
"""

from __future__ import annotations

import json
import reprlib
import sys
from typing import Annotated, Any, Literal, get_args

from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict, StrictBool, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from brigade.sampling_params import InvalidParamError, StructuredOutputsParams


ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]
CHAT_ROLES: tuple[str, ...] = get_args(ChatRole)
"""The message roles OpenAI accepts ("function" is its deprecated form of "tool"); any other is a 400."""


StrictInt = Annotated[int, Strict(), Field(ge=-2**63, le=2**63 - 1)]
"""An integer request field: a JSON integer that fits 64 bits (the engine's messages carry int64; a larger one
is a 400 naming the field, not an overflow deep in the server)."""

Number = Annotated[float, Strict(), AllowInfNan(False)]
"""A float request field: a finite JSON number; an integer (``"temperature": 1``) is taken as a float."""


class OpenAIBaseModel(BaseModel):
    """Base of every request body: unknown fields are kept (and logged), not rejected."""

    model_config = ConfigDict(extra="allow")


def _null_is_default(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """``null`` for a field OpenAI declares nullable means "not given": the field's default."""
    return cls.model_fields[info.field_name].get_default(call_default_factory=True) if value is None else value


NULL_IS_DEFAULT = {"SamplingFields": ("n", "stream"), "CompletionRequest": ("echo", "max_tokens"),
                   "ChatCompletionRequest": ("logprobs",)}
"""The fields, per request model, that OpenAI's API declares nullable but that have a non-null default here:
they are typed ``X | None`` (so the OpenAPI schema says nullable) and ``null`` becomes the default (completions'
``max_tokens: null`` is 16, OpenAI's default, not "up to the context"). The other fields OpenAI declares
nullable (temperature, top_p, stop, seed, chat's max_tokens and max_completion_tokens, completions' logprobs...)
default to None, which is their default: chat's max_tokens None means up to the model's context, as OpenAI's
chat default is unbounded."""

RequestId = Annotated[str, Strict(), Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
"""vLLM's ``request_id``: 1 to 256 characters, no control characters (it is echoed in the response id and logs)."""


class StreamOptions(OpenAIBaseModel):
    """``stream_options``: include_usage adds a final chunk with the whole request's usage; with it,
    continuous_usage_stats (vLLM's extension) also puts the usage so far in every chunk."""

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class ResponseFormat(OpenAIBaseModel):
    """``response_format``: text (no constraint), json_object, or json_schema {name, schema, strict}."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


class StructuredOutputsRequest(OpenAIBaseModel):
    """vLLM's ``structured_outputs`` extra: exactly one of json, regex, choice, grammar.

    ``json`` is a JSON schema (an object), the text of one, or ``true`` for any JSON object; another JSON type is
    refused saying so (not with the message of whichever union member pydantic tried last).
    """

    json_: str | dict | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    @field_validator("json_", mode="before")
    @classmethod
    def _json_is_a_schema(cls, value: Any) -> Any:
        if value is None or isinstance(value, (str, dict, bool)):
            return value
        # A number is quoted back by the error's formatting (errors.from_validation_error); an array is named here.
        got = ", got an array" if isinstance(value, list) else ""
        raise PydanticCustomError("json_schema_type", "must be a JSON schema (an object), a JSON string of one, or "
                                  f"true for any JSON object{got}")


class SamplingFields(OpenAIBaseModel):
    """The sampling and stopping fields shared by completions and chat completions.

    ``None`` means "not given": the model's generation_config.json default, else SamplingParams' default.
    """

    model: str | None = None
    n: StrictInt | None = 1
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    logit_bias: dict[str, Number] | None = None
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    priority: StrictInt = 0
    cache_salt: str | None = None
    vllm_xargs: dict[str, Any] | None = None
    """vLLM's extra arguments for logits processors from plugins (SamplingParams.extra_args)."""
    truncate_prompt_tokens: StrictInt | None = None
    """vLLM's: keep only the last k prompt tokens (k >= 1, or -1 for max_model_len) before the length check."""
    request_id: RequestId | None = None
    """vLLM's: the response id is ``cmpl-<request_id>`` / ``chatcmpl-<request_id>`` (a random one when None)."""

    _sampling_null_defaults = field_validator(*NULL_IS_DEFAULT["SamplingFields"])(classmethod(_null_is_default))

    def include_usage(self) -> bool:
        """True when the stream must end with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """True when every chunk carries the usage so far (``include_usage`` and ``continuous_usage_stats``)."""
        return self.include_usage() and bool(self.stream_options.continuous_usage_stats)

    def to_structured_outputs(self) -> StructuredOutputsParams | None:
        """The grammar constraint asked for by ``response_format`` or ``structured_outputs``, or None.

        Raises:
            InvalidParamError: both are given, or structured_outputs names no or several constraints.
        """
        wanted = self.response_format is not None and self.response_format.type != "text"
        if wanted and self.structured_outputs is not None:
            raise InvalidParamError("give either response_format or structured_outputs, not both",
                                    param="response_format")
        if wanted:
            fmt = self.response_format
            if fmt.type == "json_object":
                return StructuredOutputsParams(json_object=True)
            schema = (fmt.json_schema or {}).get("schema")
            if schema is None:
                raise InvalidParamError("response_format json_schema needs json_schema.schema",
                                        param="response_format")
            return StructuredOutputsParams(json=schema)
        if self.structured_outputs is None:
            return None
        so = self.structured_outputs
        params = StructuredOutputsParams(json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar)
        params.kind()  # exactly one constraint, else InvalidParamError
        return params

    def logit_bias_by_id(self, vocab_size: int) -> dict[int, float] | None:
        """``logit_bias`` with int keys, checked against the vocabulary and OpenAI's [-100, 100] range.

        Raises:
            InvalidParamError: a key is not a token id of this model, or a bias is out of range.
        """
        if not self.logit_bias:
            return None
        out: dict[int, float] = {}
        for key, bias in self.logit_bias.items():
            try:
                token_id = int(key)
            except ValueError:  # also a key of over 4,300 digits; reprlib keeps a long key's echo short
                raise InvalidParamError(f"logit_bias key {reprlib.repr(key)} is not a token id",
                                        param="logit_bias") from None
            if not 0 <= token_id < vocab_size:
                shown = key.strip() if len(key) <= 40 else reprlib.repr(key)
                raise InvalidParamError(f"logit_bias token id {shown} is outside the vocabulary "
                                        f"[0, {vocab_size})", param="logit_bias")
            if not -100.0 <= bias <= 100.0:
                raise InvalidParamError(f"logit_bias value {bias} is outside [-100, 100]", param="logit_bias")
            out[token_id] = float(bias)
        return out


class CompletionRequest(SamplingFields):
    """POST /v1/completions.

    ``prompt`` is a string, a list of strings (a batch), a list of token ids, or a list of such lists.
    ``logprobs`` is the number of top candidates per token (0..20); ``echo`` prepends the prompt.
    """

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] | None
    """Required; OpenAI's schema lets it be null, which is refused here with a 400 (as vLLM does)."""
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool | None = False
    suffix: str | None = None
    best_of: StrictInt | None = None
    add_special_tokens: StrictBool = True
    prompt_logprobs: StrictInt | None = None
    return_token_ids: StrictBool | None = None
    """vLLM's: each choice also carries ``prompt_token_ids`` and ``token_ids`` (in a stream: the prompt's in a
    choice's first chunk, each chunk's new tokens)."""

    _completion_null_defaults = field_validator(*NULL_IS_DEFAULT["CompletionRequest"])(classmethod(_null_is_default))


class ChatMessage(OpenAIBaseModel):
    """One message: role (one of CHAT_ROLES) and content (a string or a list of parts; only text parts are
    supported)."""

    role: ChatRole
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def to_template_dict(self, index: int) -> dict[str, Any]:
        """This message as the dict a chat template reads; list content is joined text.

        Raises:
            InvalidParamError: a content part is not text (images, audio... are not supported; param is the
                part, ``messages[i].content[j]``), a text part has no string ``text`` (param the part), or a
                message other than an assistant's (which may carry only tool calls) has no content, as OpenAI
                refuses.
        """
        content = self.content
        if content is None and self.role != "assistant":
            raise InvalidParamError(f"messages[{index}].content: a {self.role} message needs content (a string or "
                                    "a list of text parts), got null", param="messages")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                where = f"messages[{index}].content[{j}]"
                if part.get("type") != "text":
                    raise InvalidParamError(f"{where}: only text parts are supported, got type "
                                            f"{part.get('type')!r}", param=where)
                text = part.get("text")
                if not isinstance(text, str):
                    got = "no text" if "text" not in part else f"text of type {_json_type(text)}"
                    raise InvalidParamError(f'{where}: a text part needs a string "text", got {got}', param=where)
                texts.append(text)
            content = "\n".join(texts)
        out: dict[str, Any] = {"role": self.role, "content": content if content is not None else ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions.

    ``max_completion_tokens`` wins over the deprecated ``max_tokens``; neither means "up to the model's
    length". ``logprobs`` is a bool and ``top_logprobs`` the number of candidates (0..20).
    """

    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    """Template variables, over add_generation_prompt and continue_final_message (chat_template.py)."""
    chat_template: str | None = None
    """vLLM's per-request template: refused unless null (chat_template.refuse_request_chat_template)."""
    echo: StrictBool = False
    """vLLM's: the reply's content starts with the last message's, when that message is the assistant's."""
    prompt_logprobs: StrictInt | None = None
    """vLLM's: the response's top-level ``prompt_logprobs``, as a completion choice's (not with ``stream``)."""
    return_token_ids: StrictBool | None = None
    """vLLM's: the response carries ``prompt_token_ids`` (a stream: its first chunk) and each choice its
    ``token_ids`` (a stream: each chunk's new tokens)."""

    _chat_null_defaults = field_validator(*NULL_IS_DEFAULT["ChatCompletionRequest"])(classmethod(_null_is_default))

    def wanted_max_tokens(self) -> tuple[int | None, str]:
        """(the asked output length or None, the field that asked for it) for error messages."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class TokenizeRequest(OpenAIBaseModel):
    """POST /tokenize: either ``prompt`` (a string) or ``messages`` (rendered with the chat template, with the
    template options of a chat request)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    """Refused unless null, as in a chat request."""
    return_token_strs: StrictBool = False


class DetokenizeRequest(OpenAIBaseModel):
    """POST /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[StrictInt]


NonEmptyStr = Annotated[str, Strict(), Field(min_length=1)]
"""A string field that must be given and not be empty (a JSON string only, not a number)."""


LoRAName = Annotated[str, Strict(), Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
"""An adapter name to load: 1 to 256 characters, no control characters (it is echoed in /v1/models and logs)."""


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    """POST /v1/load_lora_adapter (vLLM's, with BRIGADE_ALLOW_RUNTIME_LORA_UPDATING): load the PEFT adapter
    folder ``lora_path`` (on the server's machine) and serve it as the model ``lora_name``."""

    lora_name: LoRAName
    lora_path: NonEmptyStr


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    """POST /v1/unload_lora_adapter: stop serving the adapter ``lora_name``; ``lora_int_id`` (vLLM's optional
    field), when given, must be that adapter's id."""

    lora_name: NonEmptyStr
    lora_int_id: StrictInt | None = None


def _json_type(value: Any) -> str:
    """The JSON type name of a decoded value (null, boolean, integer, number, string, array, object)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def parse_json_body(body: bytes) -> Any:
    """Decode a request body as JSON.

    Raises:
        InvalidParamError: the body is empty, not UTF-8, or not JSON, or holds an integer of more digits than
            Python converts (``sys.get_int_max_str_digits()``, 4300); param None: it is the whole body.
    """
    if not body.strip():
        raise InvalidParamError("the request body is empty; send a JSON object", param=None)
    try:
        text = body.decode("utf-8-sig")  # a UTF-8 byte-order mark is tolerated, as json.loads does
    except UnicodeDecodeError as exc:  # json.loads would guess UTF-16/32 and report that codec instead
        raise InvalidParamError(f"the request body is not UTF-8 text (byte {exc.start} is invalid); send UTF-8 "
                                "JSON", param=None) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidParamError(f"the request body is not valid JSON: {exc}", param=None) from None
    except ValueError:  # int() refused a number too long to convert (Python's own advice is for the server's code)
        raise InvalidParamError(f"the request body is not valid JSON: it holds a number of more than "
                                f"{sys.get_int_max_str_digits()} digits", param=None) from None
