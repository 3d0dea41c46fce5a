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
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from brigade.entrypoints.openai.errors import OpenAIError

logger = logging.getLogger(__name__)

T = TypeVar("T")

DONE_EVENT = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def json_response(payload: BaseModel, status_code: int = 200) -> Response:
    """A JSON body serialized by pydantic (non-finite floats become null, where json.dumps would fail)."""
    return Response(content=payload.model_dump_json(), status_code=status_code, media_type="application/json")


def sse_event(payload: BaseModel, *, exclude: set[str] | None = None) -> str:
    """One ``data: {json}\\n\\n`` event."""
    return f"data: {payload.model_dump_json(exclude=exclude)}\n\n"


def sse_error_event(error: OpenAIError) -> str:
    """The one error event a failed stream sends before ``[DONE]``."""
    return f"data: {error.to_response().model_dump_json()}\n\n"


async def merge_async_iterators(iterators: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Yield ``(index of the iterator, item)`` from several iterators as items arrive.

    Used to serve a batched prompt: each prompt is one engine request. When the consumer stops early
    (error, cancellation, disconnect), every pending ``__anext__`` is cancelled and every iterator closed,
    which aborts the unfinished engine requests.
    """
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    pending: dict[asyncio.Future, int] = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iterators)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                index = pending.pop(future)
                try:
                    item = future.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(iterators[index]))] = index
                yield index, item
    finally:
        with anyio.CancelScope(shield=True):
            for future in pending:
                future.cancel()
            if pending:
                await asyncio.wait(pending)
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
