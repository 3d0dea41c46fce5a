"""SamplingParams: what the user asks of one request's sampling and stopping."""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any

import msgspec

_SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20


class InvalidParamError(ValueError):
    """A request parameter is out of range; ``param`` names it (OpenAI's ``param`` field)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class RequestOutputKind(enum.IntEnum):
    """How the front end reports text: the whole text so far, only what is new, or only the end."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class StructuredOutputsParams(msgspec.Struct, omit_defaults=True):
    """One constraint on the output. Exactly one of the fields is set.

    json: a JSON schema (dict or its text), or ``{}``/``True`` for any JSON object.
    regex: a regular expression the whole output must match.
    choice: the output is exactly one of these strings.
    grammar: an EBNF grammar (GBNF dialect, as xgrammar reads it).
    """

    json: str | dict | bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def kind(self) -> str:
        set_fields = [f for f in ("json", "regex", "choice", "grammar", "json_object")
                      if getattr(self, f) not in (None, False)]
        if len(set_fields) != 1:
            raise InvalidParamError(
                f"structured_outputs needs exactly one of json, regex, choice, grammar; got {set_fields or 'none'}",
                param="structured_outputs")
        return set_fields[0]


_INT_FIELDS = ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs")
_OPTIONAL_FIELDS = ("seed", "max_tokens", "logprobs", "prompt_logprobs")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


class SamplingParams(msgspec.Struct, omit_defaults=True):
    """Sampling and stopping parameters of one request; field names follow vLLM and OpenAI.

    Attributes:
        n: number of sequences returned for the prompt (the front end fans them out).
        temperature: 0 means greedy.
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        min_p: drop tokens whose probability is below min_p times the top probability.
        seed: a per-request generator seed, so the sample is reproducible.
        presence_penalty, frequency_penalty: OpenAI's additive penalties on output tokens, in [-2, 2].
        repetition_penalty: the CTRL multiplicative penalty over prompt and output tokens; 1 disables it.
        max_tokens: the most new tokens (None: up to the model's length).
        min_tokens: EOS and stop tokens are masked until this many tokens are out.
        stop: strings that end the output; they are not shown unless include_stop_str_in_output.
        stop_token_ids: token ids that end the output (the token is kept in the ids, not in the text).
        ignore_eos: keep going past EOS.
        logprobs: number of top logprobs per output token (from the raw logits); 0 means only the chosen one.
        prompt_logprobs: the same for prompt tokens.
        logit_bias: token id -> additive bias on the logits.
        allowed_token_ids: only these tokens may be sampled.
        bad_words: words whose token sequences may never be completed.
        structured_outputs: a grammar constraint (xgrammar).
        extra_args: free-form arguments for logits processors from plugins (vLLM's ``extra_args``; the
            server fills it from the request's ``vllm_xargs``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    extra_args: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    detokenize: bool = True
    # Filled in by the front end: token-id sequences of bad_words, and the tokenizer's EOS ids.
    bad_words_token_ids: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k == -1:
            self.top_k = 0
        self.verify()

    @property
    def greedy(self) -> bool:
        """True when the sample is the argmax (temperature near 0)."""
        return self.temperature < _SAMPLING_EPS

    def verify(self) -> None:
        """Check every type and range; raises InvalidParamError naming the bad field.

        Offline users build this directly (the server's pydantic models check types first), so a float seed
        or a string temperature must fail here, naming the field, and never reach the worker.
        """
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_FIELDS:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InvalidParamError(f"{name} must be an integer, got {value!r}", param=name)
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise InvalidParamError(f"{name} must be a finite number, got {value!r}", param=name)
        if not isinstance(self.stop, (list, tuple)):  # a str is made a list in __post_init__
            raise InvalidParamError(f"stop must be a str or a list of str, got {type(self.stop).__name__} "
                                    f"{self.stop!r:.60}", param="stop")
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise InvalidParamError(f"stop_token_ids must be a list of int token ids, got {self.stop_token_ids!r:.60}",
                                    param="stop_token_ids")
        checks = [
            (self.n >= 1, "n must be at least 1", "n"),
            (self.seed is None or -(2 ** 63) <= self.seed < 2 ** 63, "seed must fit in 64 bits", "seed"),
            (self.temperature >= 0.0, "temperature must be non-negative", "temperature"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]", "top_p"),
            (self.top_k >= 0, "top_k must be -1 (disabled), 0 (disabled) or at least 1", "top_k"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]", "min_p"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]", "presence_penalty"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]", "frequency_penalty"),
            (self.repetition_penalty > 0.0, "repetition_penalty must be greater than 0", "repetition_penalty"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be at least 1", "max_tokens"),
            (self.min_tokens >= 0, "min_tokens must be non-negative", "min_tokens"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens,
             "min_tokens must not exceed max_tokens", "min_tokens"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings", "stop"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
             f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
             f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}", "prompt_logprobs"),
            (self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
             "allowed_token_ids must not be empty", "allowed_token_ids"),
        ]
        for ok, message, param in checks:
            if not ok:
                raise InvalidParamError(message, param=param)
        if self.structured_outputs is not None:
            self.structured_outputs.kind()

    def all_stop_token_ids(self, eos_token_id: int | None) -> set[int]:
        """Token ids that end this request: stop_token_ids plus EOS unless ignore_eos."""
        ids = set(self.stop_token_ids)
        if eos_token_id is not None and not self.ignore_eos:
            ids.add(eos_token_id)
        return ids
