"""BroadcastChannel: the executor's one-to-all message channel to its worker processes.

Every command (a step's ``SchedulerOutput`` above all) is pickled once and published once on a ZMQ XPUB socket
that every worker's SUB socket reads, so the cost of reaching ``n`` workers is one serialization, not ``n`` (vLLM's
``MessageQueue`` plays this part with shared memory). XPUB reports each subscription, which lets the executor
wait until every worker is connected before its first message: a PUB socket drops what it sends before a
subscriber has joined (ZMQ's "slow joiner"). Replies go back on each worker's own pipe (mp) or ``ReplySender``
socket (ray), and only the driver rank answers a step. The mp executor binds the channel to an IPC path; the ray
executor, whose workers may sit on other nodes, to a TCP port on the driver node's address.
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
    """The publishing end, in the executor's process: bound to an IPC path in a fresh temporary folder, or with
    ``host`` to a free TCP port on that address (``tcp://HOST:PORT``, for workers on other machines)."""

    def __init__(self, host: str | None = None):
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.SNDHWM, 0)  # never drop a command for a slow worker
        self._socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscription, duplicates included
        self._socket.setsockopt(zmq.LINGER, 0)
        self._dir = None
        if host is None:
            self._dir = tempfile.mkdtemp(prefix="brigade-bcast-")
            self.address = f"ipc://{os.path.join(self._dir, 'steps')}"
            self._socket.bind(self.address)
        else:
            self.address = f"tcp://{host}:{self._socket.bind_to_random_port(f'tcp://{host}')}"

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
        if self._dir is not None:
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


class ReplyReceiver:
    """The executor's end of one worker's reply socket under the ray executor (a ZMQ PULL socket bound to a free
    TCP port on ``host``): the part a pipe plays under mp. A worker that dies sends nothing more (no end of
    file): the ray executor learns of deaths from Ray itself."""

    def __init__(self, host: str):
        self._ctx = zmq.Context()
        self.socket = self._ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://{host}:{self.socket.bind_to_random_port(f'tcp://{host}')}"

    def recv(self) -> Any:
        return pickle.loads(self.socket.recv(copy=False).buffer)

    def poll(self, timeout_ms: int = 0) -> bool:
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def close(self) -> None:
        self.socket.close(linger=0)
        self._ctx.term()


class ReplySender:
    """A worker's end of its ``ReplyReceiver`` (a ZMQ PUSH socket): ``send`` pickles one reply."""

    def __init__(self, address: str):
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.LINGER, 2000)  # a last reply (a start-up error) still leaves before exit
        self._socket.connect(address)

    def send(self, reply: Any) -> None:
        self._socket.send(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL), copy=False)

    def close(self) -> None:
        self._socket.close()
        self._ctx.term()
