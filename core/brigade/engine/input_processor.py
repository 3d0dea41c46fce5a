"""InputProcessor: the front end's turn from a user prompt to EngineCoreRequests.

It tokenizes, validates every parameter against the model (so a bad request is refused before it is
queued), turns bad words into token ids, and fans ``n > 1`` out into one engine request per sequence.
"""

from __future__ import annotations

import time

import msgspec

from brigade.interfaces import EngineCoreRequest
from brigade.sampling_params import InvalidParamError, SamplingParams
from brigade.structured_output import validate_structured_outputs


def eos_token_id(hf_config) -> int | None:
    """The model config's EOS id (the first one when it lists several), for running without a tokenizer."""
    eos = getattr(hf_config, "eos_token_id", None)
    return eos[0] if isinstance(eos, list) and eos else eos


def validate_plugin_logits_processors(params: SamplingParams, vocab_size: int) -> None:
    """Run ``validate`` of every logits processor a plugin registered (the built-ins are checked above),
    so that a bad argument for a plugin's processor is a 400, not an engine failure.

    Raises:
        InvalidParamError: naming the parameter, as the processor reports it.
        PluginRuntimeError: a processor's ``validate`` raised anything else (a bug of the plugin); the message
            names the processor, its plugin and distribution, and the error.
    """
    from brigade.plugins import registries
    from brigade.plugins.errors import PluginRuntimeError
    from brigade.sample.logits_processors import BUILTIN_LOGITS_PROCESSORS

    builtins = set(BUILTIN_LOGITS_PROCESSORS.values())
    for name in registries.logits_processors.names():
        cls = registries.logits_processors.get(name)
        if cls not in builtins:
            try:
                cls.validate(params, vocab_size)
            except InvalidParamError:
                raise
            except Exception as exc:
                source = registries.logits_processors.entry(name).source.describe()
                raise PluginRuntimeError(f"logits processor {name!r} from {source} raised in validate(): "
                                         f"{type(exc).__name__}: {exc}") from exc


def child_request_id(request_id: str, index: int, n: int) -> str:
    """The engine-side id of sequence ``index`` of a request with ``n`` sequences."""
    return request_id if n == 1 else f"{index}_{request_id}"


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Token-id sequences of each bad word, with and without a leading space (as it appears mid-text), in
    first-seen order without repeats. Linear in the number of words (a set holds the sequences seen): a
    request's list of thousands of words must not cost quadratic time on a shared thread."""
    sequences: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and tuple(ids) not in seen:
                seen.add(tuple(ids))
                sequences.append(ids)
    return sequences


class InputProcessor:
    """Validates and tokenizes requests for one model.

    Args:
        tokenizer: the model's HF tokenizer.
        max_model_len: prompt plus output must fit in this many tokens.
        vocab_size: the model's vocabulary (token ids must be below it).
    """

    def __init__(self, tokenizer, max_model_len: int, vocab_size: int, eos_token_id: int | None = None):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id = tokenizer.eos_token_id if tokenizer is not None else eos_token_id

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """Return (text or None, token ids). Raises InvalidParamError for an empty or out-of-vocab prompt."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidParamError("prompt must not be empty", param="prompt")
            if self.tokenizer is None:
                raise InvalidParamError("this server runs without a tokenizer; send token ids", param="prompt")
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
            if not token_ids:
                raise InvalidParamError("prompt must not be empty", param="prompt")
        # A text prompt is checked too: a tokenizer whose vocabulary outgrows the model's embedding would
        # otherwise fail the engine's step (an IndexError in the embedding) and kill the engine.
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidParamError(f"prompt token ids must be in [0, {self.vocab_size}); got {bad[:5]}",
                                    param="prompt")
        return text, token_ids

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Check the request fits the model. Raises InvalidParamError naming the parameter."""
        num_prompt = len(prompt_token_ids)
        if num_prompt >= self.max_model_len:
            raise InvalidParamError(
                f"the prompt has {num_prompt} tokens, which leaves no room in the model's maximum context "
                f"length of {self.max_model_len} tokens", param="prompt")
        wanted = params.max_tokens if params.max_tokens is not None else 1
        if num_prompt + wanted > self.max_model_len:
            raise InvalidParamError(
                f"this model's maximum context length is {self.max_model_len} tokens; the request asks for "
                f"{num_prompt} prompt tokens plus {wanted} output tokens", param="max_tokens")
        if params.structured_outputs is not None:
            if self.tokenizer is None:
                raise InvalidParamError("structured outputs need the tokenizer; this engine runs without one",
                                        param="structured_outputs")
            validate_structured_outputs(params.structured_outputs)  # a bad schema/regex/grammar fails here
        validate_plugin_logits_processors(params, self.vocab_size)
        for name, ids in (("logit_bias", list(params.logit_bias or {})),
                          ("allowed_token_ids", params.allowed_token_ids or []),
                          ("stop_token_ids", params.stop_token_ids)):
            bad = [t for t in ids if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise InvalidParamError(f"{name} has token ids outside [0, {self.vocab_size}): {bad[:5]}",
                                        param=name)

    def bad_words_token_ids(self, words: list[str]) -> list[list[int]]:
        """See the module function ``bad_words_token_ids``."""
        return bad_words_token_ids(self.tokenizer, words)

    def process(self, prompt: str | list[int], params: SamplingParams, request_id: str, *,
                priority: int = 0, cache_salt: str | None = None, arrival_time: float | None = None,
                lora_name: str | None = None,
                lora_int_id: int | None = None) -> tuple[str | None, list[int], list[EngineCoreRequest]]:
        """Tokenize, validate and fan out one request.

        Returns:
            (prompt text or None, prompt token ids, one EngineCoreRequest per sequence). Child i has
            ``seed + i`` when a seed is given, so the n samples differ yet are reproducible. Each carries
            ``lora_name`` and ``lora_int_id`` (an adapter the caller made sure the engine has registered).
        Raises:
            InvalidParamError: the request cannot run on this model.
        """
        text, token_ids = self.tokenize(prompt)
        self.validate(token_ids, params)
        if params.bad_words and params.bad_words_token_ids is None and self.tokenizer is not None:
            params = msgspec.structs.replace(params, bad_words_token_ids=self.bad_words_token_ids(params.bad_words))
        arrival = time.time() if arrival_time is None else arrival_time
        children = []
        for i in range(params.n):
            child_params = msgspec.structs.replace(
                params, n=1, seed=None if params.seed is None else params.seed + i)
            children.append(EngineCoreRequest(
                request_id=child_request_id(request_id, i, params.n), prompt_token_ids=token_ids,
                sampling_params=child_params, eos_token_id=self.eos_token_id, arrival_time=arrival,
                priority=priority, cache_salt=cache_salt, lora_name=lora_name, lora_int_id=lora_int_id))
        return text, token_ids, children
