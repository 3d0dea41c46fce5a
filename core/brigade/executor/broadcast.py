"""BroadcastChannel: the executor's one-to-all message channel to its worker processes.

Every command (a step's ``SchedulerOutput`` above all) is pickled once and published once on a ZMQ XPUB socket
that every worker's SUB socket reads, so the cost of reaching ``n`` workers is one serialization, not ``n`` (vLLM's
``MessageQueue`` plays this part with shared memory). XPUB reports each subscription, which lets the executor
wait until every worker is connected before its first message: a PUB socket drops what it sends before a
subscriber has joined (ZMQ's "slow joiner"). Replies go back on each worker's own pipe, and only the driver rank
answers a step.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq


class BroadcastChannel:
    """The publishing end, in the executor's process, bound to an IPC path in a fresh temporary folder."""

    def __init__(self):
        self._dir = tempfile.mkdtemp(prefix="brigade-bcast-")
        self.address = f"ipc://{os.path.join(self._dir, 'steps')}"
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.SNDHWM, 0)  # never drop a command for a slow worker
        self._socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscription, duplicates included
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(self.address)

    def wait_for_subscribers(self, count: int, check_alive: Callable[[], None], timeout_s: float = 600.0) -> None:
        """Block until ``count`` workers subscribed; ``check_alive`` raises when a worker died meanwhile.

        Raises:
            TimeoutError: fewer than ``count`` joined within ``timeout_s``.
        """
        joined, deadline = 0, time.monotonic() + timeout_s
        while joined < count:
            if self._socket.poll(200, zmq.POLLIN):
                if self._socket.recv()[:1] == b"\x01":  # a subscription (b"\x00" would be an unsubscription)
                    joined += 1
                continue
            check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {joined} of {count} workers joined the command channel in {timeout_s:g} s")

    def publish(self, message: Any) -> None:
        """Pickle ``message`` once and send it to every worker."""
        self._socket.send(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL), copy=False)

    def close(self) -> None:
        self._socket.close(linger=0)
        self._ctx.term()
        try:
            os.unlink(self.address.removeprefix("ipc://"))
            os.rmdir(self._dir)
        except OSError:
            pass


class BroadcastSubscriber:
    """A worker's reading end of a ``BroadcastChannel``."""

    def __init__(self, address: str):
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.SUB)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(address)

    def receive(self) -> Any:
        """The next message, in publishing order (blocks)."""
        return pickle.loads(self._socket.recv(copy=False).buffer)

    def close(self) -> None:
        self._socket.close(linger=0)
        self._ctx.term()
