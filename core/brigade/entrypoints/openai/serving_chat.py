"""POST /v1/chat/completions: messages, rendered by the tokenizer's chat template, to chat completions.

The template is applied as text (``add_generation_prompt=True`` by default), then tokenized without
special tokens, since the template writes them itself (the renderer step). Streams send a
first chunk per choice whose delta has ``role: "assistant"``, then content deltas; the last content
chunk carries ``finish_reason``. Tools and tool_choice are served by tool_calls.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from brigade.entrypoints.openai.chat_template import (control_arguments, refuse_request_chat_template,
                                                      template_options)
from brigade.entrypoints.openai.errors import OpenAIError
from brigade.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, TokenizeRequest
from brigade.entrypoints.openai.responses import (ChatChoice, ChatCompletionResponse, ChatCompletionStreamResponse,
                                                  ChatLogprobs, ChatLogprobToken, ChatResponseMessage,
                                                  ChatStreamChoice, ChatTopLogprob, DeltaMessage, UsageInfo)
from brigade.entrypoints.openai.prompt_result import PromptResult
from brigade.entrypoints.openai.serving_base import OpenAIServing
from brigade.entrypoints.openai.streaming import (DONE_EVENT, SSE_HEADERS, json_response, run_unless_disconnected,
                                                  shielded, sse_error_event, sse_event, without_token_ids)
from brigade.entrypoints.openai.tool_calls import (ToolPlan, ToolStream, make_tool_plan, parse_tool_calls,
                                                   prepare_conversation)
from brigade.interfaces import Logprob
from brigade.sampling_params import MAX_LOGPROBS, SamplingParams

TEMPLATE_RUNTIME_ERRORS = (TypeError, AttributeError, LookupError, ArithmeticError)
"""What a chat template (or transformers around it) raises on a value it cannot use, e.g. ``documents: 1``:
the request's fault, so a 400, never a 500."""


class OpenAIServingChat(OpenAIServing):
    """The /v1/chat/completions handler.

    Args:
        chat_template: a Jinja template that replaces the tokenizer's (``--chat-template``), or None.
    """

    def __init__(self, engine: Any, *, chat_template: str | None = None, **kwargs: Any):
        super().__init__(engine, **kwargs)
        self.chat_template = chat_template
        # The template call's own arguments, which chat_template_kwargs may not set.
        self.control_arguments = control_arguments(self.tokenizer)

    @staticmethod
    def check_generation_prompt(request: ChatCompletionRequest | TokenizeRequest) -> None:
        """vLLM's ``check_generation_prompt``: a body that sets both ``continue_final_message`` and
        ``add_generation_prompt`` to true is a 400. As in vLLM (a validator on the raw body), only fields the
        client sent count: ``continue_final_message: true`` alone continues the message (the default
        generation prompt is then off).

        Raises: OpenAIError: 400 naming continue_final_message, with vLLM's message."""
        if (request.continue_final_message and request.add_generation_prompt
                and "add_generation_prompt" in request.model_fields_set):
            raise OpenAIError.bad_param("Cannot set both `continue_final_message` and `add_generation_prompt` "
                                        "to True.", "continue_final_message")

    async def render_messages(self, messages: list[ChatMessage], *, add_generation_prompt: bool,
                              continue_final_message: bool = False, add_special_tokens: bool = False,
                              template_kwargs: dict[str, Any] | None = None,
                              tool_plan: ToolPlan | None = None, length_param: str | None = None) -> list[int]:
        """Messages -> prompt token ids, through the chat template, on the tokenizer thread.

        ``add_generation_prompt`` and ``continue_final_message`` are the request's fields; its
        ``template_kwargs`` (chat_template_kwargs) override them and add template variables, and continuing the
        final message turns the default generation prompt off (chat_template.template_options).
        ``add_special_tokens`` is False by default: the template already writes BOS and the role markers.
        ``tool_plan``'s tools go to a template that reads ``tools``; one that does not gets them described
        in the system message (tool_calls.prepare_conversation). With ``length_param``, a rendered text
        certainly too long for the model is refused before it is tokenized (check_text_length).

        Raises:
            OpenAIError: 400 for no messages, non-text content, no tokenizer, no template, a chat_template_kwargs key the
                template call owns, a template error (whatever the template raised, a TypeError included), or
                (with ``length_param``, naming it) a prompt certainly too long.
        """
        if not messages:
            raise OpenAIError.bad_param("messages must hold at least one message", "messages")
        options = template_options(template_kwargs, add_generation_prompt=add_generation_prompt,
                                   continue_final_message=continue_final_message, control=self.control_arguments)
        conversation = [m.to_template_dict(i) for i, m in enumerate(messages)]
        self.require_tokenizer("rendering chat messages", "messages",
                               "send token-id prompts to /v1/completions")
        if self.chat_template is None and not getattr(self.tokenizer, "chat_template", None):
            raise OpenAIError.bad_param("this model's tokenizer has no chat template; start the server with "
                                        "--chat-template, or use /v1/completions", "messages")
        plan = tool_plan or ToolPlan("none")
        template = self.chat_template or self.tokenizer.chat_template
        knows_tools = isinstance(template, str) and "tools" in template
        conversation = prepare_conversation(conversation, plan, knows_tools)
        tools = None
        if knows_tools and plan.active:
            tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                       "parameters": t.parameters}} for t in plan.tools.values()]

        def render() -> list[int]:
            try:
                text = self.tokenizer.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=options.add_generation_prompt,
                    continue_final_message=options.continue_final_message, chat_template=self.chat_template,
                    tools=tools, **options.variables)
            except (jinja2.TemplateError, ValueError) as exc:  # the template rejected these messages
                raise OpenAIError.bad_param(f"the chat template rejected the messages: {exc}", "messages") from None
            except TEMPLATE_RUNTIME_ERRORS as exc:  # a value the template (or transformers) could not use
                param = "chat_template_kwargs" if options.variables else "messages"
                raise OpenAIError.bad_param(f"the chat template failed on this request's {param}: "
                                            f"{type(exc).__name__}: {exc}", param) from None
            if length_param is not None:
                self.check_text_length(len(text), length_param)
            return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

        return await self.run_tokenizer(render)

    async def create_chat_completion(self, request: ChatCompletionRequest, raw_request: Request) -> Response:
        """Validate and render before queuing, then generate (streamed or not).

        Raises:
            OpenAIError: 400 (bad field, tools, too long), 404 (model), 503 (engine dead).
        """
        await self.check_request(request)
        refuse_request_chat_template(request.chat_template)
        if request.prompt_logprobs is not None and request.stream:  # vLLM's rule: they come with the whole reply
            raise OpenAIError.bad_param("prompt_logprobs are not available with stream=true", "prompt_logprobs")
        own_constraint = self.structured_outputs(request)
        plan = make_tool_plan(request.tools, request.tool_choice, request.parallel_tool_calls,
                              other_constraint=own_constraint is not None)
        num_logprobs = self._num_logprobs(request)
        keep = self.truncation(request)  # truncate_prompt_tokens: the prompt's last tokens, before the length check
        self.check_generation_prompt(request)
        prompt_ids = await self.render_messages(
            request.messages, add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message, add_special_tokens=request.add_special_tokens,
            template_kwargs=request.chat_template_kwargs, tool_plan=plan,
            length_param="messages" if keep is None else None)
        if keep is not None:
            prompt_ids = prompt_ids[-keep:]
        wanted, param = request.wanted_max_tokens()
        max_tokens = self.check_length(len(prompt_ids), wanted, prompt_param="messages", max_tokens_param=param)
        params = await self.with_bad_words_ids(
            self.sampling_params(request, max_tokens=max_tokens, logprobs=num_logprobs,
                                 structured_outputs=plan.constraint() or own_constraint,
                                 prompt_logprobs=request.prompt_logprobs))
        response_id, request_id = self.response_ids("chatcmpl", request)
        if request.stream:
            return StreamingResponse(self._stream(request, prompt_ids, params, response_id, request_id, plan),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        completed, response = await run_unless_disconnected(
            raw_request, self._full(request, prompt_ids, params, response_id, request_id, plan))
        if not completed:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return json_response(response, exclude=None if request.return_token_ids
                             else without_token_ids(None, response_field=True))

    @staticmethod
    def _num_logprobs(request: ChatCompletionRequest) -> int | None:
        if request.top_logprobs is not None:
            if not request.logprobs:
                raise OpenAIError.bad_param("top_logprobs needs logprobs: true", "top_logprobs")
            if not 0 <= request.top_logprobs <= MAX_LOGPROBS:
                raise OpenAIError.bad_param(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", "top_logprobs")
        if not request.logprobs:
            return None
        return request.top_logprobs or 0

    @staticmethod
    def _echo(request: ChatCompletionRequest) -> str:
        """What ``echo`` puts before the reply, as vLLM: the last message's content when it is the assistant's
        (the message the reply continues, or an assistant turn the reply follows); "" otherwise."""
        last = request.messages[-1]
        if not request.echo or last.role != "assistant":
            return ""
        return last.to_template_dict(len(request.messages) - 1)["content"]

    def _logprobs(self, token_ids: list[int], logprobs: list[dict[int, Logprob]], num_top: int) -> ChatLogprobs:
        content = []
        for token_id, candidates in zip(token_ids, logprobs):
            chosen = candidates.get(token_id)
            token = self.decode_token(token_id, chosen)
            ranked = sorted((kv for kv in candidates.items() if kv[1].rank is not None and kv[1].rank <= num_top),
                            key=lambda kv: kv[1].rank)
            top = [ChatTopLogprob(token=(t := self.decode_token(tid, lp)), logprob=lp.logprob,
                                  bytes=list(t.encode("utf-8"))) for tid, lp in ranked]
            content.append(ChatLogprobToken(token=token, logprob=chosen.logprob if chosen else float("-inf"),
                                            bytes=list(token.encode("utf-8")), top_logprobs=top))
        return ChatLogprobs(content=content)

    async def _full(self, request: ChatCompletionRequest, prompt_ids: list[int], params: SamplingParams,
                    response_id: str, request_id: str, plan: ToolPlan) -> ChatCompletionResponse:
        result = PromptResult(prompt_ids)
        finished = False
        try:
            async for output in self.generate(prompt_ids, params, request_id, request):
                result.add(output)
                finished = output.finished
        except Exception as exc:  # becomes the client's error; nothing is swallowed
            raise self.as_openai_error(exc) from exc
        finally:
            if not finished:  # an error or a client disconnect: free the engine's KV blocks now
                await shielded(lambda: self.abort([request_id]))
        choices = []
        echo = self._echo(request)
        for j in range(request.n):
            state = result.choices.get(j)
            if state is None:
                raise OpenAIError(f"the engine returned no output for choice {j}", status_code=500,
                                  type="server_error")
            logprobs = (self._logprobs(state.token_ids, state.logprobs, params.logprobs)
                        if params.logprobs is not None else None)
            message, finish_reason = self._message(state.text, state.finish_reason, plan)
            if echo:
                message.content = echo + (message.content or "")
            choices.append(ChatChoice(index=j, message=message, logprobs=logprobs, finish_reason=finish_reason,
                                      stop_reason=state.stop_reason,
                                      token_ids=list(state.token_ids) if request.return_token_ids else None))
        usage = UsageInfo.from_counts(len(prompt_ids), result.num_generated_tokens(), result.num_cached_tokens)
        prompt_logprobs = self.prompt_logprobs(result) if request.prompt_logprobs is not None else None
        return ChatCompletionResponse(id=response_id, model=self.model_name(request), choices=choices, usage=usage,
                                      prompt_logprobs=prompt_logprobs,
                                      prompt_token_ids=list(prompt_ids) if request.return_token_ids else None)

    @staticmethod
    def _message(text: str, finish_reason: str | None, plan: ToolPlan) -> tuple[ChatResponseMessage, str | None]:
        """A finished choice's message: its tool calls, else its text. finish_reason "stop" becomes "tool_calls"
        when the model chose to call (tool_choice auto or required), and stays "stop" for a forced named
        function, as OpenAI and vLLM."""
        calls = plan.calls_from_output(text) if plan.active else None
        if not calls:
            return ChatResponseMessage(content=text), finish_reason
        content = None
        if plan.mode == "auto":
            content = parse_tool_calls(text, plan.tools)[0]
        return ChatResponseMessage(content=content, tool_calls=calls), plan.finish_reason(finish_reason)

    async def _stream(self, request: ChatCompletionRequest, prompt_ids: list[int], params: SamplingParams,
                      response_id: str, request_id: str, plan: ToolPlan) -> AsyncIterator[str]:
        created = int(time.time())
        ids = request.return_token_ids
        # The usage chunk keeps its usage; the others drop it unless stream_options.continuous_usage_stats.
        with_usage = None if ids else without_token_ids(None, response_field=True)
        exclude = None if request.include_usage() else {"usage"}
        if not ids:
            exclude = without_token_ids(exclude, response_field=True)

        def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None,
                  prompt_token_ids: list[int] | None = None) -> str:
            body = ChatCompletionStreamResponse(id=response_id, created=created, model=self.model_name(request),
                                                choices=choices, usage=usage, prompt_token_ids=prompt_token_ids)
            return sse_event(body, exclude=with_usage if usage is not None else exclude)

        result = PromptResult(prompt_ids)
        tool_streams = {j: ToolStream(plan) for j in range(request.n)}
        finished = False
        try:
            echo = self._echo(request)
            for j in range(request.n):
                yield chunk([ChatStreamChoice(index=j, delta=DeltaMessage(role="assistant", content=""))],
                            prompt_token_ids=list(prompt_ids) if ids and j == 0 else None)
                if echo:  # as vLLM: the echoed message is the first content delta
                    yield chunk([ChatStreamChoice(index=j, delta=DeltaMessage(content=echo))])
            async for output in self.generate(prompt_ids, params, request_id, request):
                finished = output.finished
                for delta in result.add(output):
                    if not (delta.text or delta.token_ids or delta.finish_reason):
                        continue
                    logprobs = (self._logprobs(delta.token_ids, delta.logprobs or [], params.logprobs)
                                if params.logprobs is not None else None)
                    sent = tool_streams[delta.index].feed(delta.text)
                    finish_reason = delta.finish_reason
                    if finish_reason is not None:
                        last, finish_reason = tool_streams[delta.index].finish(finish_reason)
                        sent.content = (sent.content or "") + (last.content or "") or None
                        sent.tool_calls = (sent.tool_calls or []) + (last.tool_calls or []) or None
                    elif sent.content is None and sent.tool_calls is None and logprobs is None and not ids:
                        continue  # text held back for a tool call: nothing to send yet
                    so_far = (UsageInfo.from_counts(len(prompt_ids), result.num_generated_tokens(),
                                                    result.num_cached_tokens) if request.continuous_usage() else None)
                    yield chunk([ChatStreamChoice(index=delta.index,
                                                  delta=DeltaMessage(content=sent.content, tool_calls=sent.tool_calls),
                                                  logprobs=logprobs, finish_reason=finish_reason,
                                                  stop_reason=delta.stop_reason,
                                                  token_ids=list(delta.token_ids) if ids else None)], so_far)
            if request.include_usage():
                usage = UsageInfo.from_counts(len(prompt_ids), result.num_generated_tokens(),
                                              result.num_cached_tokens)
                yield chunk([], usage)
        except Exception as exc:  # reported to the client as the stream's one error event
            yield sse_error_event(self.as_openai_error(exc))
        finally:
            if not finished:
                await shielded(lambda: self.abort([request_id]))
        yield DONE_EVENT
