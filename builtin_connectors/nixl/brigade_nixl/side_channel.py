"""The side channel: the small request/reply protocol a consumer speaks with a producer's pool, over ZeroMQ.

The producer's worker binds a ROUTER socket on ``tcp://host:port`` and answers on a daemon thread
(``SideChannelServer``); consumers connect with a REQ socket (``SideChannelClient``). Messages are msgpack maps
(msgspec), one request, one reply:

- ``{"op": "handshake", "version": 1, "layout": <KVCacheLayout.key()>}`` ->
  ``{"agent": name, "agent_metadata": bytes, "base_address": int, "slot_bytes": int, "num_slots": int,
  "layout": key, "lease_s": float}``: what a consumer needs to READ slots with NIXL.
- ``{"op": "lookup", "layout": key, "keys": [hex block key, ...], "release": lease id or 0}`` ->
  ``{"agent": name, "lease": id, "slot_ids": [int, ...], "lease_s": float}``: the slots of the longest leading
  run of ``keys`` in the pool, leased (0 and [] when none); ``release`` ends an older lease of the same request.
- ``{"op": "release", "leases": [id, ...]}`` -> ``{}``.

Any refusal is ``{"error": "one line"}``: another protocol version or KV layout (blocks only move between equal
layouts), a malformed message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import msgspec
import zmq

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
_POLL_MS = 100  # how often the server thread looks at its stop flag


class SideChannelError(Exception):
    """The producer did not answer in time, answered garbage, or refused (the message says which)."""


class SideChannelServer:
    """Answers consumers' requests on ``tcp://host:port`` from a daemon thread, with ``handle(request) -> reply``
    (both dicts; an exception in ``handle`` becomes an ``{"error": ...}`` reply).

    Raises:
        OSError: the address cannot be bound (in use, or not an address of this host); one line.
    """

    def __init__(self, host: str, port: int, handle: Callable[[dict], dict]):
        self.address = f"tcp://{host}:{port}"
        self._handle = handle
        self._ctx = zmq.Context()
        self._socket = self._ctx.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(self.address)
        except zmq.ZMQError as exc:
            self._socket.close()
            self._ctx.term()
            raise OSError(f"cannot bind the side channel to {self.address}: {exc}") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"brigade-nixl-side-channel-{port}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(dict)
        try:
            while not self._stop.is_set():
                if not self._socket.poll(_POLL_MS):
                    continue
                frames = self._socket.recv_multipart()
                identity, payload = frames[0], frames[-1]
                try:
                    reply = self._handle(decoder.decode(payload))
                except Exception as exc:  # a consumer's bad message must not stop the channel
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                self._socket.send_multipart([identity, b"", encoder.encode(reply)])
        except zmq.ZMQError as exc:
            if not self._stop.is_set():
                logger.warning("NIXL side channel %s stopped: %s", self.address, exc)
        finally:
            self._socket.close()

    def close(self) -> None:
        """Stop the thread and close the socket (the port is free afterwards); idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._ctx.term()


class SideChannelClient:
    """Sends requests to the producer at ``tcp://host:port`` and waits ``timeout_s`` for each reply.

    Used from one thread only. A request that times out closes the socket (a REQ socket cannot send again
    before it receives); the next request opens a new one.
    """

    def __init__(self, host: str, port: int, timeout_s: float):
        self.address = f"tcp://{host}:{port}"
        self.timeout_ms = max(1, int(timeout_s * 1000))
        self._ctx = zmq.Context()
        self._socket: zmq.Socket | None = None
        self._encoder, self._decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(dict)

    def call(self, request: dict) -> dict:
        """Send ``request``, return the reply.

        Raises:
            SideChannelError: no reply within the timeout, an undecodable one, or an ``{"error": ...}`` reply.
        """
        if self._socket is None:
            self._socket = self._ctx.socket(zmq.REQ)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.connect(self.address)
        try:
            self._socket.send(self._encoder.encode(request), flags=zmq.NOBLOCK)
            if not self._socket.poll(self.timeout_ms):
                raise SideChannelError(f"no answer from the producer at {self.address} within "
                                       f"{self.timeout_ms / 1000:g} s")
            reply = self._decoder.decode(self._socket.recv())
        except (zmq.ZMQError, msgspec.DecodeError, SideChannelError) as exc:
            self._drop_socket()
            if isinstance(exc, SideChannelError):
                raise
            raise SideChannelError(f"side channel to {self.address} failed: {exc}") from None
        if "error" in reply:
            raise SideChannelError(f"the producer at {self.address} refused: {reply['error']}")
        return reply

    def _drop_socket(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def close(self) -> None:
        """Close the socket and the context; idempotent."""
        self._drop_socket()
        if not self._ctx.closed:
            self._ctx.term()
