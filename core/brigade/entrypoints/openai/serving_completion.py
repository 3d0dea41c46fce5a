"""POST /v1/completions: prompts (text, token ids, or a batch of either) to text_completion responses.

Each prompt of a batch is one engine request; choice ``index`` is ``prompt_index * n + i`` as in OpenAI.
Streams use DELTA outputs and end with an optional usage chunk, then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.protocol import CompletionRequest
from brigade.entrypoints.openai.responses import (CompletionChoice, CompletionLogprobs, CompletionResponse,
                                                  CompletionStreamResponse, UsageInfo)
from brigade.entrypoints.openai.prompt_result import PromptResult
from brigade.entrypoints.openai.serving_base import OpenAIServing
from brigade.entrypoints.openai.streaming import (DONE_EVENT, SSE_HEADERS, json_response, merge_async_iterators,
                                                  run_unless_disconnected, shielded, sse_error_event, sse_event,
                                                  without_token_ids)
from brigade.entrypoints.openai.text_offsets import TextOffsets, prompt_offsets
from brigade.interfaces import CompletionOutput, Logprob
from brigade.sampling_params import SamplingParams


@dataclass
class PromptInput:
    """One prompt of a request: its text (None when given as token ids) and its token ids."""

    text: str | None
    token_ids: list[int]


@dataclass
class StreamedChoice:
    """What one streamed choice has sent: its characters so far, and the logprob entries held back.

    A token's logprob entry goes out with the chunk that sends the start of its text (its offset below what has
    been sent); at the end every held entry goes, cut to the text's end as the full response cuts it. So
    streamed and full offsets agree even where a stop string held text back and then cut it, and they never
    decrease.
    """

    text_offsets: TextOffsets  # the choice's tokens' offsets
    num_chars: int = 0  # characters of text sent so far (an echoed prompt's included)
    pending: list[tuple[int, dict[int, Logprob] | None, int]] = field(default_factory=list)
    """(token id, its candidates, its text offset) of the entries held back."""

    def take_ready(self, entries: Iterable[tuple[int, dict[int, Logprob] | None, int]], *,
                   final: bool) -> list[tuple[int, dict[int, Logprob] | None, int]]:
        """Add ``entries`` to the held ones and take those that may go now (all of them when ``final``)."""
        self.pending.extend(entries)
        if final:
            ready = [(t, c, min(o, self.num_chars)) for t, c, o in self.pending]
            self.pending = []
            return ready
        n = 0
        while n < len(self.pending) and self.pending[n][2] < self.num_chars:
            n += 1
        ready, self.pending = self.pending[:n], self.pending[n:]
        return ready


def echo_only(request: CompletionRequest) -> bool:
    """``echo`` with ``max_tokens: 0``: the response holds the prompt (and its logprobs) and nothing generated."""
    return bool(request.echo) and request.max_tokens == 0


# How many prompts of one request are checked between two turns of the event loop.
PROMPTS_PER_LOOP_TURN = 1024
MAX_SEQUENCES_PER_REQUEST = 100_000  # prompts x n of one completions request; docs/server.md


def check_fanout(request: CompletionRequest) -> None:
    """Refuse a request that would start more than ``MAX_SEQUENCES_PER_REQUEST`` sequences (prompts x n) before
    any prompt is tokenized.

    Raises:
        OpenAIError: 400 naming ``prompt``.
    """
    prompt = request.prompt
    num_prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    if num_prompts * (request.n or 1) > MAX_SEQUENCES_PER_REQUEST:
        raise OpenAIError.bad_param(f"{num_prompts} prompts x n {request.n} would start "
                                    f"{num_prompts * (request.n or 1)} sequences; one request may start at most "
                                    f"{MAX_SEQUENCES_PER_REQUEST} (send several requests)", "prompt")


class OpenAIServingCompletion(OpenAIServing):
    """The /v1/completions handler."""

    async def create_completion(self, request: CompletionRequest, raw_request: Request) -> Response:
        """Validate, tokenize and check every prompt before queuing anything, then generate.

        Raises:
            OpenAIError: 400 (bad field, empty prompt, too long), 404 (model), 503 (engine dead).
        """
        await self.check_request(request)
        if request.suffix is not None:
            raise OpenAIError.not_supported("suffix (insertion)", "suffix")
        if request.best_of is not None and request.best_of < 1:
            raise OpenAIError.bad_param(f"best_of must be at least 1, got {request.best_of}", "best_of")
        if request.best_of is not None and request.best_of < request.n:  # OpenAI's and vLLM's rule, checked first
            raise OpenAIError.bad_param(f"best_of must be greater than or equal to n, got best_of {request.best_of} "
                                        f"and n {request.n}", "best_of")
        if request.best_of is not None and request.best_of != request.n:
            raise OpenAIError.not_supported("best_of greater than n", "best_of")
        check_fanout(request)
        # echo with logprobs scores the prompt too: the engine computes prompt logprobs for it.
        prompt_logprobs = request.prompt_logprobs
        if request.echo and request.logprobs is not None:
            prompt_logprobs = max(prompt_logprobs or 0, request.logprobs)
        prompts = await self._prompt_inputs(request)
        params = []
        # echo with max_tokens 0 scores the prompt only (lm-eval's loglikelihood): the engine runs one token
        # that the response leaves out, as vLLM does.
        wanted = 1 if echo_only(request) else request.max_tokens
        # Prompts differ only in their max_tokens (what the context leaves when it is not given): one
        # SamplingParams per distinct value, not per prompt, so a list of 100,000 prompts costs one validation.
        by_max_tokens: dict[int, SamplingParams] = {}
        for i, prompt in enumerate(prompts):
            max_tokens = self.check_length(len(prompt.token_ids), wanted, prompt_param="prompt",
                                           max_tokens_param="max_tokens",
                                           max_tokens_defaulted="max_tokens" not in request.model_fields_set)
            if max_tokens not in by_max_tokens:
                by_max_tokens[max_tokens] = self.sampling_params(request, max_tokens=max_tokens,
                                                                 logprobs=request.logprobs,
                                                                 prompt_logprobs=prompt_logprobs)
            params.append(by_max_tokens[max_tokens])
            if i % PROMPTS_PER_LOOP_TURN == PROMPTS_PER_LOOP_TURN - 1:
                await asyncio.sleep(0)  # other requests (and /health) get the loop between slices
        if params and params[0].bad_words:  # the same words for every prompt: tokenized once
            first = await self.with_bad_words_ids(params[0])
            params = [msgspec.structs.replace(p, bad_words_token_ids=first.bad_words_token_ids) for p in params]
        base_id, engine_base = self.response_ids("cmpl", request)
        request_ids = [f"{engine_base}-{i}" for i in range(len(prompts))]
        if request.stream:
            return StreamingResponse(self._stream(request, prompts, params, base_id, request_ids),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        completed, response = await run_unless_disconnected(
            raw_request, self._full(request, prompts, params, base_id, request_ids))
        if not completed:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return json_response(response, exclude=None if request.return_token_ids
                             else without_token_ids(None, response_field=False))

    async def _prompt_inputs(self, request: CompletionRequest) -> list[PromptInput]:
        """Every prompt of the request as text and token ids; texts certainly too long are refused before
        any is tokenized (check_text_length), so a huge prompt never holds the tokenizer thread.

        With ``truncate_prompt_tokens`` k, each prompt keeps its last k tokens (vLLM's semantics) and no text is
        refused for its length before tokenizing (it is cut after); a prompt that was cut keeps no text, so an
        echo shows the tokens the model saw.

        Raises:
            OpenAIError: 400 naming prompt (null, empty, out of vocabulary, too long) or truncate_prompt_tokens.
        """
        prompt = request.prompt
        keep = self.truncation(request)
        if prompt is None:
            raise OpenAIError.bad_param("prompt is required: a string, a list of strings, a list of token ids or a "
                                        "list of such lists; got null", "prompt")
        if isinstance(prompt, str):
            raw: list[str | list[int]] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            raw = [list(prompt)]
        else:
            raw = list(prompt)
        if not raw:
            raise OpenAIError.bad_param("prompt must not be empty", "prompt")
        for item in raw:
            if not item:
                raise OpenAIError.bad_param("prompt must not be empty (nor hold an empty prompt)", "prompt")
            if isinstance(item, str) and keep is None:
                self.check_text_length(len(item), "prompt")
        inputs = []
        for item in raw:
            if isinstance(item, str):
                token_ids = await self.tokenize(item, add_special_tokens=request.add_special_tokens)
                if not token_ids:
                    raise OpenAIError.bad_param("prompt tokenizes to no tokens", "prompt")
                inputs.append(PromptInput(item, token_ids))
            else:
                self.check_token_ids(item, "prompt")
                inputs.append(PromptInput(None, list(item)))
                if len(inputs) % PROMPTS_PER_LOOP_TURN == 0:
                    await asyncio.sleep(0)
        if keep is not None:
            inputs = [p if len(p.token_ids) <= keep else PromptInput(None, p.token_ids[-keep:]) for p in inputs]
        return inputs

    @staticmethod
    def _num_completion_tokens(request: CompletionRequest, results: list[PromptResult]) -> int:
        """usage.completion_tokens: the tokens returned. echo with max_tokens 0 returns none (the one token the
        engine generated to score the prompt is dropped), so it counts none."""
        return 0 if echo_only(request) else sum(r.num_generated_tokens() for r in results)

    def _prompt_text(self, prompt: PromptInput) -> str:
        """The prompt as ``echo`` returns it: its text, or its ids decoded ("" without a tokenizer, which returns
        no text at all; the ids and their logprobs are still echoed)."""
        if prompt.text is not None:
            return prompt.text
        return "" if self.tokenizer is None else self.tokenizer.decode(prompt.token_ids)

    def _logprobs(self, token_ids: list[int], logprobs: list[dict[int, Logprob] | None], num_top: int,
                  text_offsets: list[int]) -> CompletionLogprobs:
        """Legacy completions logprobs for a run of tokens whose texts start at ``text_offsets`` (TextOffsets)."""
        out = CompletionLogprobs()
        for token_id, candidates, offset in zip(token_ids, logprobs, text_offsets):
            token = self.decode_token(token_id, candidates.get(token_id) if candidates else None)
            out.tokens.append(token)
            out.text_offset.append(offset)
            if not candidates:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(candidates[token_id].logprob if token_id in candidates else None)
            ranked = sorted(candidates.items(), key=lambda kv: (kv[1].rank or 0))
            top = {self.decode_token(t, lp): lp.logprob for t, lp in ranked
                   if t == token_id or (lp.rank is not None and lp.rank <= num_top)}
            out.top_logprobs.append(top)
        return out

    def _echo_logprobs(self, prompt: PromptInput, result: PromptResult, num_top: int,
                       generated: CompletionLogprobs) -> CompletionLogprobs:
        """Logprobs of an echoed prompt (the first token has none), followed by ``generated``'s."""
        offsets = prompt_offsets(self.tokenizer, prompt.token_ids, self._prompt_text(prompt))
        part = self._logprobs(prompt.token_ids, result.prompt_logprobs or [None] * len(prompt.token_ids), num_top,
                              offsets)
        return CompletionLogprobs(text_offset=part.text_offset + generated.text_offset,
                                  token_logprobs=part.token_logprobs + generated.token_logprobs,
                                  tokens=part.tokens + generated.tokens,
                                  top_logprobs=part.top_logprobs + generated.top_logprobs)

    def _text_offsets(self, request: CompletionRequest, prompt: PromptInput, start: int) -> TextOffsets:
        """The text offsets of one choice's generated tokens, the first at ``start`` (after an echoed prompt)."""
        return TextOffsets(self.tokenizer, start=start, context=prompt.token_ids,
                           skip_special_tokens=request.skip_special_tokens)

    def _prompt_logprobs(self, request: CompletionRequest, result: PromptResult) -> list | None:
        """vLLM's ``prompt_logprobs`` field of a choice, when the request asked for it (echo with logprobs also
        makes the engine score the prompt, without the field)."""
        return self.prompt_logprobs(result) if request.prompt_logprobs is not None else None

    async def _full(self, request: CompletionRequest, prompts: list[PromptInput], params: list[SamplingParams],
                    base_id: str, request_ids: list[str]) -> CompletionResponse:
        results = [PromptResult(p.token_ids) for p in prompts]
        iterators = [self.generate(p.token_ids, sp, rid, request)
                     for p, sp, rid in zip(prompts, params, request_ids)]
        finished: set[int] = set()
        try:
            async for i, output in merge_async_iterators(iterators):
                results[i].add(output)
                if output.finished:
                    finished.add(i)
        except Exception as exc:  # becomes the client's error; nothing is swallowed
            raise self.as_openai_error(exc) from exc
        finally:
            unfinished = [rid for i, rid in enumerate(request_ids) if i not in finished]
            if unfinished:  # an error or a client disconnect: free the engine's KV blocks now
                await shielded(lambda: self.abort(unfinished))
        choices = []
        for i, (prompt, result) in enumerate(zip(prompts, results)):
            for j in range(request.n):
                state = result.choices.get(j)
                if state is None:
                    raise OpenAIError(f"the engine returned no output for choice {j} of prompt {i}",
                                      status_code=500, type="server_error")
                prefix = self._prompt_text(prompt) if request.echo else ""
                text, token_ids, token_logprobs = state.text, state.token_ids, state.logprobs
                if echo_only(request):
                    text, token_ids, token_logprobs = "", [], []
                logprobs = None
                if request.logprobs is not None:
                    # At most the text's length: a stop string may cut the text before the last token's start.
                    offsets = [min(o, len(prefix) + len(text))
                               for o in self._text_offsets(request, prompt, len(prefix)).offsets(token_ids)]
                    logprobs = self._logprobs(token_ids, token_logprobs, request.logprobs, offsets)
                    if request.echo:
                        logprobs = self._echo_logprobs(prompt, result, request.logprobs, logprobs)
                ids = request.return_token_ids
                choices.append(CompletionChoice(index=i * request.n + j, text=prefix + text, logprobs=logprobs,
                                                prompt_logprobs=self._prompt_logprobs(request, result),
                                                finish_reason=state.finish_reason, stop_reason=state.stop_reason,
                                                prompt_token_ids=list(prompt.token_ids) if ids else None,
                                                token_ids=list(token_ids) if ids else None))
        usage = UsageInfo.from_counts(sum(len(p.token_ids) for p in prompts),
                                      self._num_completion_tokens(request, results),
                                      sum(r.num_cached_tokens for r in results))
        return CompletionResponse(id=base_id, model=self.model_name(request), choices=choices, usage=usage)

    async def _stream(self, request: CompletionRequest, prompts: list[PromptInput], params: list[SamplingParams],
                      base_id: str, request_ids: list[str]) -> AsyncIterator[str]:
        created = int(time.time())
        exclude = None if request.include_usage() else {"usage"}
        if not request.return_token_ids:
            exclude = without_token_ids(exclude, response_field=False)
        results = [PromptResult(p.token_ids) for p in prompts]
        streamed: dict[int, StreamedChoice] = {}  # choice index -> what it has sent
        finished: set[int] = set()
        iterators = [self.generate(p.token_ids, sp, rid, request)
                     for p, sp, rid in zip(prompts, params, request_ids)]
        try:
            async for i, output in merge_async_iterators(iterators):
                for delta in results[i].add(output):
                    if not (delta.text or delta.token_ids or delta.finish_reason):
                        continue  # e.g. a prefill chunk that only brought prompt logprobs
                    choice = self._stream_choice(request, prompts[i], results[i], i * request.n + delta.index,
                                                 delta, streamed)
                    so_far = (UsageInfo.from_counts(len(prompts[i].token_ids),
                                                    self._num_completion_tokens(request, [results[i]]),
                                                    results[i].num_cached_tokens)
                              if request.continuous_usage() else None)  # this prompt's usage so far
                    yield sse_event(CompletionStreamResponse(id=base_id, created=created,
                                                             model=self.model_name(request), choices=[choice],
                                                             usage=so_far),
                                    exclude=exclude)
                if output.finished:
                    finished.add(i)
            if request.include_usage():
                usage = UsageInfo.from_counts(sum(len(p.token_ids) for p in prompts),
                                              self._num_completion_tokens(request, results),
                                              sum(r.num_cached_tokens for r in results))
                yield sse_event(CompletionStreamResponse(id=base_id, created=created, model=self.model_name(request),
                                                         choices=[], usage=usage))
        except Exception as exc:  # reported to the client as the stream's one error event
            yield sse_error_event(self.as_openai_error(exc))
        finally:
            unfinished = [rid for i, rid in enumerate(request_ids) if i not in finished]
            if unfinished:
                await shielded(lambda: self.abort(unfinished))
        yield DONE_EVENT

    def _stream_choice(self, request: CompletionRequest, prompt: PromptInput, result: PromptResult, index: int,
                       delta: CompletionOutput, streamed: dict[int, StreamedChoice]) -> CompletionChoice:
        """The choice one streamed chunk carries for ``delta``; the choice's first chunk echoes the prompt (fully
        scored by then) and carries its ``prompt_logprobs``."""
        text, token_ids, token_logprobs = delta.text, delta.token_ids, delta.logprobs or []
        if echo_only(request):
            text, token_ids, token_logprobs = "", [], []
        first = index not in streamed
        prefix, prompt_logprobs = "", None
        if first:
            prefix = self._prompt_text(prompt) if request.echo else ""
            prompt_logprobs = self._prompt_logprobs(request, result)
            streamed[index] = StreamedChoice(self._text_offsets(request, prompt, len(prefix)))
        state = streamed[index]
        state.num_chars += len(prefix) + len(text)
        logprobs = None
        if request.logprobs is not None:
            entries = zip(token_ids, token_logprobs, state.text_offsets.offsets(token_ids))
            # Without a tokenizer no text ever comes to carry an entry: each goes out with its token.
            ready = state.take_ready(entries, final=delta.finish_reason is not None or self.tokenizer is None)
            logprobs = self._logprobs([t for t, _, _ in ready], [c for _, c, _ in ready], request.logprobs,
                                      [o for _, _, o in ready])
            if first and request.echo:
                logprobs = self._echo_logprobs(prompt, result, request.logprobs, logprobs)
        ids = request.return_token_ids
        return CompletionChoice(index=index, text=prefix + text, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                                finish_reason=delta.finish_reason, stop_reason=delta.stop_reason,
                                prompt_token_ids=list(prompt.token_ids) if ids and first else None,
                                token_ids=list(token_ids) if ids else None)

