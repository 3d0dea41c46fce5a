"""Graceful shutdown: on SIGTERM, in-flight requests run on for ``--shutdown-timeout`` seconds, then end cleanly.

uvicorn stops accepting connections and waits for the open ones, but when its timeout passes it cancels
the handlers mid-write: a stream just stops, with no error event and no ``[DONE]``. Brigade ends them
itself instead. Every engine iterator a route consumes goes through ``Drain.guard``; when the drain
deadline passes, the guard raises a 503 "shutting down" error, so a stream sends its one error event and
``[DONE]``, a non-streamed request gets a 503 body, and the request is aborted in the engine (its KV
blocks are freed). uvicorn is given a short grace period beyond the deadline for those last writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

import anyio
import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from brigade.entrypoints.openai.errors import OpenAIError

logger = logging.getLogger("brigade.server")

T = TypeVar("T")

__all__ = ["Drain", "DrainingServer", "FLUSH_GRACE_S"]

FLUSH_GRACE_S = 2.0
"""How long uvicorn waits, past the drain deadline, for the cut requests to send their last bytes."""


class Drain:
    """The server's shutdown state, shared by every route.

    Invariant: ``expired`` is set at most once, ``timeout_s`` after ``begin()``; ``in_flight`` counts the
    guarded iterators not yet finished.
    """

    def __init__(self) -> None:
        self.expired = asyncio.Event()
        self.in_flight = 0
        self.draining = False

    def begin(self, timeout_s: float) -> None:
        """Start draining: requests still running in ``timeout_s`` seconds are cut."""
        if self.draining:
            return
        self.draining = True
        logger.info("shutting down: %d request(s) in flight get %.1f s to finish", self.in_flight, timeout_s)
        asyncio.get_running_loop().call_later(timeout_s, self._expire)

    def _expire(self) -> None:
        if self.in_flight:
            logger.warning("shutdown timeout: cutting %d request(s) still in flight", self.in_flight)
        self.expired.set()

    async def guard(self, iterator: AsyncIterator[T]) -> AsyncIterator[T]:
        """Yield ``iterator``'s items until it ends or the drain deadline passes.

        Raises:
            OpenAIError: 503 when the deadline passes first; the pending ``anext`` is cancelled, which
                makes the engine's generate() abort the request.
        """
        self.in_flight += 1
        deadline = asyncio.ensure_future(self.expired.wait())
        step: asyncio.Future | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(iterator))
                await asyncio.wait({step, deadline}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    raise OpenAIError("The server is shutting down; the request was cut at its shutdown timeout",
                                      status_code=503, type="server_error", code="shutting_down")
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            self.in_flight -= 1
            # Shielded: this also runs when the consumer is cancelled (client gone), and the engine iterator
            # must still be closed so that it aborts its request.
            with anyio.CancelScope(shield=True):
                deadline.cancel()
                if step is not None and not step.done():
                    step.cancel()
                    await asyncio.wait({step})
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that starts the Drain when it begins shutting down (SIGTERM or SIGINT).

    Args:
        config: uvicorn's config; its ``timeout_graceful_shutdown`` should be ``drain_timeout_s`` plus
            FLUSH_GRACE_S.
        drain: the app's Drain.
        drain_timeout_s: ``--shutdown-timeout``.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_timeout_s: float):
        super().__init__(config)
        self.drain = drain
        self.drain_timeout_s = drain_timeout_s

    async def shutdown(self, sockets=None) -> None:
        self.drain.begin(self.drain_timeout_s)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, except on exit: instead of handing the captured SIGTERM/SIGINT back to the previous handler
        (which read in the log as a second signal), a later signal only logs, so that the engine's shutdown after
        ``serve()`` returns finishes and the process exits 0. Before ``serve()``, the previous handlers stay: during
        start-up a signal ends the command at once (``brigade.entrypoints.cli.interrupts``)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self.handle_exit)
        try:
            yield
        finally:
            for sig in HANDLED_SIGNALS:
                signal.signal(sig, _already_shutting_down)


def _already_shutting_down(signum, frame) -> None:
    logger.info("signal %d received while shutting down; shutdown is already under way", signum)
