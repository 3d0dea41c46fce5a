"""What every OpenAI route shares: model and health checks, tokenizing off the event loop, the length
check made before queuing, and the mapping from request fields to SamplingParams."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from pydantic import BaseModel

from brigade.engine.async_llm import EngineDeadError
from brigade.engine.core_client import EngineRequestError
from brigade.engine.input_processor import bad_words_token_ids, validate_plugin_logits_processors
from brigade.entrypoints.openai.errors import OpenAIError, from_invalid_param
from brigade.entrypoints.openai.prompt_result import PromptResult
from brigade.entrypoints.openai.protocol import SamplingFields
from brigade.entrypoints.openai.responses import PromptLogprob
from brigade.entrypoints.openai.shutdown import Drain
from brigade.entrypoints.openai.streaming import LOOP_SLICE
from brigade.interfaces import Logprob, LoRARequest, RequestOutput
from brigade.plugins.errors import PluginRuntimeError
from brigade.sampling_params import InvalidParamError, RequestOutputKind, SamplingParams, StructuredOutputsParams
from brigade.structured_output import validate_structured_outputs

logger = logging.getLogger(__name__)

MAX_N = 128  # most sequences one request may ask for; more is a denial-of-service risk, not a use case
GUIDED_FIELDS = {
    "guided_json": 'structured_outputs {"json": <schema>} or response_format {"type": "json_schema", '
                   '"json_schema": {"name": ..., "schema": <schema>}}',
    "guided_regex": 'structured_outputs {"regex": <pattern>}',
    "guided_choice": 'structured_outputs {"choice": [<strings>]}',
    "guided_grammar": 'structured_outputs {"grammar": <EBNF grammar>}',
}
"""vLLM's removed guided-decoding fields and what replaces each: given (not null), they are a 400, never ignored
(ignoring one would return unconstrained output to a client that asked for a constraint)."""


MAX_LOGGED_PARAMS_CHARS = 2000  # a request's params in the request log (vLLM's --max-log-len does the same)
MAX_BAD_WORDS = 4096  # per request: each word is tokenized twice on the server's one tokenizer thread


def brief(text: str, limit: int = MAX_LOGGED_PARAMS_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out (long stop strings, id lists)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def max_token_chars(tokenizer: Any) -> int | None:
    """The most characters of prompt text one token can cover (the server computes it once, at start-up).

    A prompt of C characters is then at least ceil(C / L) tokens, known without tokenizing it. L is the
    longest token string of the vocabulary and of the added/special tokens' contents. A vocabulary string
    is never shorter than the text its token decodes to (byte-level BPE writes one character per byte,
    SentencePiece writes "\u2581" for a space; byte-fallback and WordPiece markers only add characters),
    and reading it is one dict walk, not one decode per token.

    Returns:
        L, or None when the tokenizer cannot say (no pre-check is made then).
    """
    if tokenizer is None:
        return None
    try:
        longest = max((len(piece) for piece in tokenizer.get_vocab()), default=0)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        longest = max([longest, *(len(str(getattr(t, "content", t))) for t in added.values())])
    except Exception:  # an unusual tokenizer: tokenizing stays the only length check
        logger.warning("cannot bound characters per token for %s; long prompts are tokenized before the "
                       "length check", type(tokenizer).__name__, exc_info=True)
        return None
    return longest if longest > 0 else None


class OpenAIServing:
    """Shared state and checks of the OpenAI routes. One instance per route family, per app.

    Args:
        engine: the AsyncLLM handle (its EngineCore runs in another process).
        served_model_name: the served model's name, or its names (``--served-model-name a b``): each is accepted as
            ``model``, and responses name the first.
        tokenizer_executor: one worker thread; tokenizing and chat-template rendering run there so the
            event loop keeps streaming other requests (HF fast tokenizers release the GIL).
        generation_defaults: sampling defaults from generation_config.json.
        log_requests: log each request's id, prompt length and parameters at INFO.
        drain: the server's shutdown Drain; engine iterators are cut through it at the shutdown timeout.
        scheduling_policy: the engine's ``--scheduling-policy`` ("fcfs" or "priority"); a nonzero
            ``priority`` is refused under fcfs, as vLLM does.
        max_token_chars: ``max_token_chars(tokenizer)``, computed once by the server for all its handlers;
            None makes no check before tokenizing.
        lora_requests: the served LoRA adapters by name, read live (the engine's ``AsyncLLM.lora_requests``:
            ``--lora-modules``, then runtime loads, less unloads); a request whose ``model`` is one of these
            names runs on that adapter, and its responses name it as their ``model`` (as vLLM's do).
    """

    def __init__(self, engine: Any, *, served_model_name: str | Sequence[str], tokenizer_executor: ThreadPoolExecutor,
                 generation_defaults: dict[str, Any], log_requests: bool = True, drain: Drain | None = None,
                 scheduling_policy: str = "fcfs", max_token_chars: int | None = None,
                 lora_requests: Mapping[str, LoRARequest] | None = None):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.max_model_len
        names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name)
        self.served_model_names: tuple[str, ...] = tuple(names)
        self.served_model_name = names[0]  # the name responses carry
        self.tokenizer_executor = tokenizer_executor
        self.generation_defaults = generation_defaults
        self.log_requests = log_requests
        self.drain = drain
        self.scheduling_policy = scheduling_policy
        # Characters one token covers at most, for refusing huge prompts without tokenizing them.
        self.max_token_chars = max_token_chars
        # Adapter name -> LoRARequest, shared with the engine and the other handlers (not copied).
        self.lora_requests: Mapping[str, LoRARequest] = lora_requests if lora_requests is not None else {}
        # Without a tokenizer (--skip-tokenizer-init) prompts are token ids checked against the model's vocab.
        self.vocab_size = len(self.tokenizer) if self.tokenizer is not None else engine.hf_config.vocab_size

    # ---- checks --------------------------------------------------------------------------------------
    async def check_request(self, request: BaseModel) -> None:
        """404 for another model, 503 for a dead engine (so a stream fails before it starts), 400 for
        ``stream_options`` without ``stream`` (as OpenAI and vLLM), for ``priority`` / ``cache_salt`` values
        vLLM refuses and for vLLM's removed ``guided_*`` fields (GUIDED_FIELDS); warns about fields this server
        ignores.

        Raises:
            OpenAIError: 404, 503 or 400.
        """
        model = getattr(request, "model", None)
        if model is not None and model not in self.served_model_names and model not in self.lora_requests:
            raise OpenAIError.model_not_found(model, self.served_model_names, list(self.lora_requests))
        try:
            await self.engine.check_health()
        except EngineDeadError as exc:
            raise OpenAIError.engine_dead(str(exc)) from None
        if isinstance(request, SamplingFields):
            self._check_guided_fields(request)
        if request.model_extra:
            logger.warning("ignoring unknown request fields: %s", sorted(request.model_extra))
        if getattr(request, "stream_options", None) is not None and not getattr(request, "stream", False):
            raise OpenAIError.bad_param("stream_options can only be given with stream=true", "stream_options")
        self._check_scheduling_fields(request)

    @staticmethod
    def _check_guided_fields(request: SamplingFields) -> None:
        """Raises OpenAIError: 400 naming the first of vLLM's removed ``guided_*`` fields the request sets (not
        null), and what replaces it."""
        for name, instead in GUIDED_FIELDS.items():
            if (request.model_extra or {}).get(name) is not None:
                raise OpenAIError.bad_param(
                    f"{name} is not supported: vLLM removed the guided_* fields in favour of structured_outputs; "
                    f"send {instead} instead", name)

    def truncation(self, request: SamplingFields) -> int | None:
        """How many prompt tokens ``truncate_prompt_tokens`` keeps (the last ones), as vLLM: None (no
        truncation), k >= 1, or -1 for max_model_len.

        Raises:
            OpenAIError: 400 naming truncate_prompt_tokens for 0, below -1, or above max_model_len.
        """
        k = request.truncate_prompt_tokens
        if k is None:
            return None
        if k == -1:
            return self.max_model_len
        if k < 1:
            raise OpenAIError.bad_param(f"truncate_prompt_tokens must be at least 1, or -1 for the model's maximum "
                                        f"context length ({self.max_model_len}), got {k}", "truncate_prompt_tokens")
        if k > self.max_model_len:
            raise OpenAIError.bad_param(f"truncate_prompt_tokens {k} is greater than this model's maximum context "
                                        f"length ({self.max_model_len} tokens); use at most {self.max_model_len}, "
                                        "or -1", "truncate_prompt_tokens")
        return k

    def response_ids(self, prefix: str, request: SamplingFields) -> tuple[str, str]:
        """(the response's ``id``, the base of its engine request ids).

        Without vLLM's ``request_id`` both are ``PREFIX-<random>``. With it the response id is
        ``PREFIX-<request_id>``, as vLLM's, and the engine ids add a random part, so two requests a client sent
        with one request_id never collide in the engine (its ids are unique among requests in flight).
        """
        if request.request_id is None:
            request_id = random_request_id(prefix)
            return request_id, request_id
        response_id = f"{prefix}-{request.request_id}"
        return response_id, f"{response_id}-{uuid.uuid4().hex[:8]}"

    def _check_scheduling_fields(self, request: BaseModel) -> None:
        """``priority`` needs ``--scheduling-policy priority`` unless it is 0; ``cache_salt`` must not be "".

        Raises:
            OpenAIError: 400 naming priority or cache_salt.
        """
        priority = getattr(request, "priority", 0)
        if priority != 0 and self.scheduling_policy != "priority":
            raise OpenAIError.bad_param(
                f"priority is only supported with --scheduling-policy priority; this server schedules "
                f"{self.scheduling_policy}, got priority {priority}", "priority")
        if getattr(request, "cache_salt", None) == "":
            raise OpenAIError.bad_param("cache_salt must be a non-empty string if given", "cache_salt")

    def min_tokens(self, num_chars: int) -> int | None:
        """The fewest tokens a text of ``num_chars`` characters can be, ceil(num_chars / max_token_chars),
        known without tokenizing it; None when the tokenizer gave no bound."""
        return math.ceil(num_chars / self.max_token_chars) if self.max_token_chars else None

    def check_text_length(self, num_chars: int, param: str) -> None:
        """Refuse, without tokenizing, a prompt text that is certainly too long: ``num_chars`` characters
        are at least ceil(num_chars / max_token_chars) tokens (max_token_chars()).

        Raises:
            OpenAIError: 400 naming ``param`` when that many tokens leave no room in max_model_len (the
                same refusal check_length makes once the prompt is tokenized, saying "at least").
        """
        at_least = self.min_tokens(num_chars)
        if at_least is not None and at_least >= self.max_model_len:
            raise OpenAIError.bad_param(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has at least "
                f"{at_least} tokens ({num_chars} characters), which leaves no room for output. Shorten the "
                "prompt.", param)

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None, *, prompt_param: str,
                     max_tokens_param: str, max_tokens_defaulted: bool = False) -> int:
        """The output budget of one prompt, checked against max_model_len before the request is queued.

        ``max_tokens_defaulted``: the client did not send ``max_tokens_param`` (the endpoint's default applies),
        which the error message then says.

        Returns:
            max_tokens, or all the room left when it is None.
        Raises:
            OpenAIError: 400 when the prompt leaves no room, or prompt + max_tokens > max_model_len.
        """
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise OpenAIError.bad_param(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{num_prompt_tokens} tokens, which leaves no room for output. Shorten the prompt.", prompt_param)
        if max_tokens is None:
            return room
        if max_tokens < 1:
            raise OpenAIError.bad_param(f"{max_tokens_param} must be at least 1, got {max_tokens}", max_tokens_param)
        if max_tokens > room:
            default = f", the default {max_tokens_param}" if max_tokens_defaulted else ""
            raise OpenAIError.bad_param(
                f"This model's maximum context length is {self.max_model_len} tokens; you asked for "
                f"{num_prompt_tokens + max_tokens} ({num_prompt_tokens} in the prompt, {max_tokens} in the "
                f"output{default}). Reduce the prompt or {max_tokens_param}.", max_tokens_param)
        return max_tokens

    # ---- tokenizer work, off the event loop --------------------------------------------------------
    async def run_tokenizer(self, fn, *args, **kwargs):
        """Run a tokenizer call on the tokenizer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.tokenizer_executor, lambda: fn(*args, **kwargs))

    def require_tokenizer(self, what: str, param: str | None, instead: str) -> None:
        """Refuse what needs text when the server runs without a tokenizer (``--skip-tokenizer-init``).

        Raises:
            OpenAIError: 400 naming ``param``: "``what`` needs the tokenizer ...; ``instead``".
        """
        if self.tokenizer is None:
            raise OpenAIError.bad_param(f"{what} needs the tokenizer, and this server runs without one "
                                        f"(--skip-tokenizer-init); {instead}", param)

    async def tokenize(self, text: str, *, add_special_tokens: bool, param: str = "prompt") -> list[int]:
        """``text``'s token ids, on the tokenizer thread.

        Raises:
            OpenAIError: 400 naming ``param`` when the server has no tokenizer (send token ids instead).
        """
        self.require_tokenizer("a text prompt", param, "send the prompt as token ids")
        return await self.run_tokenizer(
            lambda: self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode_token(self, token_id: int, logprob: Logprob | None = None) -> str:
        """The text of one token, for logprobs (the detokenizer's text when it sent one); ``token_id:N`` on a
        server without a tokenizer, as vLLM writes a token it returns as an id."""
        if logprob is not None and logprob.decoded_token is not None:
            return logprob.decoded_token
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def prompt_logprobs(self, result: PromptResult) -> list[dict[int, PromptLogprob] | None] | None:
        """vLLM's ``prompt_logprobs`` field (a completion choice's, a chat response's): per prompt token, None for
        the first (it has no context), else {token id: PromptLogprob}; None when the engine scored no prompt."""
        if result.prompt_logprobs is None:
            return None
        return [None if entry is None else
                {tid: PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=self.decode_token(tid, lp))
                 for tid, lp in entry.items()} for entry in result.prompt_logprobs]

    # ---- SamplingParams ------------------------------------------------------------------------------
    def sampling_params(self, request: SamplingFields, *, max_tokens: int, logprobs: int | None,
                        structured_outputs: StructuredOutputsParams | None = None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """Map the request's OpenAI and vLLM fields onto SamplingParams (DELTA output for streams too).

        Args:
            structured_outputs: a constraint that replaces the request's own (a forced tool call's),
                already validated.
        Raises:
            OpenAIError: 400 naming the field that is out of range or not supported yet (stop strings and
                bad_words on a server without a tokenizer); a schema, regex or grammar that xgrammar rejects
                is refused here, before anything is queued.
        """
        if structured_outputs is None:
            structured_outputs = self.structured_outputs(request)
        if not 1 <= request.n <= MAX_N:
            raise OpenAIError.bad_param(f"n must be between 1 and {MAX_N}, got {request.n}", "n")
        given = {k: getattr(request, k) for k in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                                    "frequency_penalty", "repetition_penalty")
                 if getattr(request, k) is not None}
        fields = {**self.generation_defaults, **given}
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        if stop:  # matched against the generated text, which a server without a tokenizer does not have
            self.require_tokenizer("stop (strings)", "stop", "use stop_token_ids")
        if request.bad_words:
            self.require_tokenizer("bad_words", "bad_words", "ban single tokens with logit_bias -100 instead")
        try:
            params = SamplingParams(
                n=request.n, seed=request.seed, max_tokens=max_tokens, min_tokens=request.min_tokens,
                stop=stop, stop_token_ids=self._checked_token_ids(list(request.stop_token_ids or []),
                                                                  "stop_token_ids"),
                ignore_eos=request.ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                include_stop_str_in_output=request.include_stop_str_in_output,
                skip_special_tokens=request.skip_special_tokens,
                spaces_between_special_tokens=request.spaces_between_special_tokens,
                logit_bias=request.logit_bias_by_id(self.vocab_size),
                allowed_token_ids=self._checked_token_ids(request.allowed_token_ids, "allowed_token_ids"),
                bad_words=self._checked_bad_words(request.bad_words), structured_outputs=structured_outputs,
                extra_args=request.vllm_xargs, output_kind=RequestOutputKind.DELTA, **fields)
            validate_plugin_logits_processors(params, self.vocab_size)  # as the engine would, but before a stream
            return params
        except InvalidParamError as exc:
            raise from_invalid_param(exc) from None
        except PluginRuntimeError as exc:  # a plugin's validate() failed: a 500 naming it, the server goes on
            logger.error("%s", exc, exc_info=exc.__cause__)
            raise self.as_openai_error(exc) from None

    @staticmethod
    def structured_outputs(request: SamplingFields) -> StructuredOutputsParams | None:
        """The request's response_format / structured_outputs constraint, checked by xgrammar.

        Raises:
            OpenAIError: 400 naming response_format or structured_outputs.
        """
        param = "structured_outputs" if request.structured_outputs is not None else "response_format"
        try:
            constraint = request.to_structured_outputs()
            if constraint is not None:
                validate_structured_outputs(constraint, param=param)
        except InvalidParamError as exc:
            raise OpenAIError.bad_param(str(exc), exc.param or param) from None
        return constraint

    def _checked_bad_words(self, words: list[str] | None) -> list[str] | None:
        """Raises OpenAIError: 400 naming bad_words when one is empty (it would match nothing; vLLM refuses it),
        when there are more than MAX_BAD_WORDS, or when one is certainly longer than the context (it could
        never be generated; its characters over the longest vocabulary string reach max_model_len)."""
        if words is None:
            return None
        if any(not w for w in words):
            raise OpenAIError.bad_param("bad_words must be non-empty strings", "bad_words")
        if len(words) > MAX_BAD_WORDS:
            raise OpenAIError.bad_param(f"bad_words holds {len(words)} words; at most {MAX_BAD_WORDS} are accepted",
                                        "bad_words")
        longest = max((len(w) for w in words), default=0)
        at_least = self.min_tokens(longest)
        if at_least is not None and at_least > self.max_model_len:
            raise OpenAIError.bad_param(f"bad_words holds a word of {longest} characters, more than the "
                                        f"{self.max_model_len} tokens of context could ever generate", "bad_words")
        return words

    async def with_bad_words_ids(self, params: SamplingParams) -> SamplingParams:
        """``params`` with its bad words tokenized on the tokenizer thread (the engine would otherwise do it
        on the event loop, where a long list holds every request)."""
        if not params.bad_words or self.tokenizer is None:
            return params
        ids = await self.run_tokenizer(bad_words_token_ids, self.tokenizer, params.bad_words)
        return msgspec.structs.replace(params, bad_words_token_ids=ids)

    def _checked_token_ids(self, token_ids: list[int] | None, param: str) -> list[int] | None:
        if token_ids is not None and any(not 0 <= t < self.vocab_size for t in token_ids):
            raise OpenAIError.bad_param(f"{param} holds ids outside the vocabulary [0, {self.vocab_size})", param)
        return token_ids

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        """400 when a token-id prompt holds an id outside the vocabulary."""
        self._checked_token_ids(list(token_ids), param)

    def model_name(self, request: BaseModel) -> str:
        """The ``model`` a response names: the request's LoRA adapter, else the served model's first name
        (whichever of its names the request gave, as vLLM). A request check_request let through names one of
        them; it keeps naming its adapter after an unload (a stream started on an adapter finishes on it)."""
        model = getattr(request, "model", None)
        return self.served_model_name if model is None or model in self.served_model_names else model

    # ---- engine --------------------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                 request: SamplingFields):
        """Start one engine request; the iterator yields DELTA RequestOutputs."""
        if self.log_requests:
            logger.info("request %s: %d prompt tokens, params=%s", request_id, len(prompt_token_ids),
                        brief(repr(msgspec.structs.replace(params, bad_words_token_ids=None))))
        model = getattr(request, "model", None)
        lora_request = self.lora_requests.get(model)
        if lora_request is None and model is not None and model not in self.served_model_names:
            # check_request passed, but the adapter was unloaded while the prompt was being prepared: the
            # iterator raises the usual 404, where the callers handle an engine's errors.
            return _raising(OpenAIError.model_not_found(model, self.served_model_names, list(self.lora_requests)))
        kwargs = {"lora_request": lora_request} if lora_request is not None else {}  # test engines may lack it
        outputs = self.engine.generate(prompt_token_ids, params, request_id, priority=request.priority,
                                       cache_salt=request.cache_salt, **kwargs)
        return outputs if self.drain is None else self.drain.guard(outputs)

    async def abort(self, request_ids: Sequence[str]) -> None:
        """Stop unfinished engine requests (the client left, or an error was sent to it) and free their KV
        blocks; logged at INFO with the requests' other lines."""
        for count, request_id in enumerate(request_ids, 1):
            if count % LOOP_SLICE == 0:
                await asyncio.sleep(0)  # thousands of aborts: let the loop serve other clients between slices
            if self.log_requests:
                logger.info("request %s aborted before it finished (client gone or error sent); KV blocks freed",
                            request_id)
            await self.engine.abort(request_id)

    def as_openai_error(self, exc: Exception) -> OpenAIError:
        """The client-facing form of an error raised while a request ran (stream or not).

        InvalidParamError is the engine refusing the request (400); EngineRequestError (a plugin's logits processor
        failed on this request) and PluginRuntimeError are a 500 with their line, naming the plugin; EngineDeadError,
        or any error once the engine is marked dead, is a 503; anything else is a bug (500, logged with its
        traceback).
        """
        if isinstance(exc, OpenAIError):
            return exc
        if isinstance(exc, InvalidParamError):
            return from_invalid_param(exc)
        if isinstance(exc, (EngineRequestError, PluginRuntimeError)):  # this request failed; the engine lives
            return OpenAIError(str(exc), status_code=500, type="server_error")
        if isinstance(exc, EngineDeadError) or self.engine.errored:
            return OpenAIError.engine_dead(str(exc))
        logger.error("request failed inside the engine", exc_info=exc)
        return OpenAIError(f"internal server error: {type(exc).__name__}: {exc}", status_code=500,
                           type="server_error")


async def _raising(error: Exception) -> AsyncIterator[RequestOutput]:
    """An iterator that raises ``error`` when first read."""
    raise error
    yield  # unreachable: makes this an async generator


def random_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
