"""Server-sent events, iterator merging and client-disconnect handling for the OpenAI routes.

Disconnects must reach the engine: a request whose client went away is aborted, so its KV blocks go back to the pool
(an invariant the robustness tests check). Starlette cancels a streaming body when the client disconnects; the
cleanup code below runs under a shielded cancel scope, because anyio re-delivers a cancellation at every ``await``
inside a cancelled scope and an unshielded ``await engine.abort(...)`` would never run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from brigade.entrypoints.openai.errors import OpenAIError

logger = logging.getLogger(__name__)

T = TypeVar("T")

DONE_EVENT = "data: [DONE]\n\n"
# A request of thousands of prompts starts (and aborts) its engine requests this many per event-loop turn, so the
# server keeps answering everyone else (/health included) while it admits or drops them.
LOOP_SLICE = 16
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


Exclude = set[str] | dict[str, Any] | None
"""Fields left out of a serialized body, in pydantic's ``exclude`` form (``{"choices": {"__all__": {...}}}``
reaches into every choice)."""


def json_response(payload: BaseModel, status_code: int = 200, *, exclude: Exclude = None) -> Response:
    """A JSON body serialized by pydantic (non-finite floats become null, where json.dumps would fail)."""
    return Response(content=payload.model_dump_json(exclude=exclude), status_code=status_code,
                    media_type="application/json")


def without_token_ids(exclude: Exclude, *, response_field: bool) -> Exclude:
    """``exclude`` plus vLLM's ``return_token_ids`` fields, for a request that did not ask for them: the choices'
    ``token_ids`` (and, for completions, ``prompt_token_ids``), and with ``response_field`` (chat) the response's
    ``prompt_token_ids``. The bodies are then what they were before the option existed."""
    out: dict[str, Any] = dict.fromkeys(exclude or (), True)
    out["choices"] = {"__all__": {"token_ids"} if response_field else {"token_ids", "prompt_token_ids"}}
    if response_field:
        out["prompt_token_ids"] = True
    return out


def sse_event(payload: BaseModel, *, exclude: Exclude = None) -> str:
    """One ``data: {json}\\n\\n`` event."""
    return f"data: {payload.model_dump_json(exclude=exclude)}\n\n"


def sse_error_event(error: OpenAIError) -> str:
    """The one error event a failed stream sends before ``[DONE]``."""
    return f"data: {error.to_response().model_dump_json()}\n\n"


_EXHAUSTED = object()  # a pump's last message: its iterator has no more items


async def merge_async_iterators(iterators: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Yield ``(index of the iterator, item)`` from several iterators as items arrive.

    Used to serve a batched prompt: each prompt is one engine request. One task per iterator pumps its items
    into a shared queue, so each item costs O(1) whatever the number of iterators (``asyncio.wait`` over every
    pending ``__anext__`` would cost O(iterators) per item: quadratic for a list of thousands of prompts). An
    iterator's exception is raised here. When the consumer stops early (error, cancellation, disconnect), every
    pump is cancelled and every iterator closed, which aborts the unfinished engine requests, each in O(1).
    """
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, object, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, iterator: AsyncIterator[T]) -> None:
        try:
            async for item in iterator:
                queue.put_nowait((index, item, None))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((index, None, exc))
            return
        queue.put_nowait((index, _EXHAUSTED, None))

    pumps: list[asyncio.Task] = []
    try:
        for i, it in enumerate(iterators):
            pumps.append(asyncio.ensure_future(pump(i, it)))
            if len(pumps) % LOOP_SLICE == 0:
                await asyncio.sleep(0)  # let the loop answer other clients between slices of admissions
        remaining = len(pumps)
        while remaining:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is _EXHAUSTED:
                remaining -= 1
                continue
            yield index, item  # type: ignore[misc]
    finally:
        with anyio.CancelScope(shield=True):
            for start in range(0, len(pumps), LOOP_SLICE):  # aborts, a slice per loop turn
                chunk = pumps[start:start + LOOP_SLICE]
                for task in chunk:
                    task.cancel()
                await asyncio.gather(*chunk, return_exceptions=True)
            for it in iterators:
                aclose = getattr(it, "aclose", None)
                if aclose is not None:
                    await aclose()


async def wait_for_disconnect(raw_request: Request) -> None:
    """Return when the client closes the connection (the ASGI ``http.disconnect`` message).

    Only valid after the body was read: the next message the server can send is then the disconnect.
    """
    while True:
        message = await raw_request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_unless_disconnected(raw_request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """Run ``work`` (a non-streaming generation) while watching for the client going away.

    Returns:
        (True, result) when ``work`` finished; (False, None) when the client disconnected first, in
        which case ``work`` was cancelled (closing its engine iterators aborts the requests).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(raw_request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        with anyio.CancelScope(shield=True):
            watcher.cancel()
            if not task.done():
                task.cancel()
            await asyncio.wait({task, watcher})
    if task.cancelled():
        return False, None
    return True, task.result()


async def shielded(cleanup: Callable[[], Awaitable[object]]) -> None:
    """Await ``cleanup()`` even inside a cancelled scope; log (never hide) its failure."""
    with anyio.CancelScope(shield=True):
        try:
            await cleanup()
        except Exception:  # cleanup runs while another error may be propagating; report, don't mask it
            logger.exception("cleanup after a finished or disconnected request failed")
