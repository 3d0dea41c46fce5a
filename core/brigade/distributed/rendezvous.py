"""The rendezvous store: the ``torch.distributed`` key-value store every rank of one engine meets at.

The executor hosts it, in its own process, on a port the operating system assigns when the store starts
listening (``TCPStore`` on port 0), and hands its ``HOST:PORT`` to each rank; the ranks connect to it as
clients. Probing for a free port and letting rank 0 bind it later races with every other process on the host
that binds a port in between (``EADDRINUSE`` at start-up, seen when several engines start at once); a store
that is already listening cannot lose its port.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist


class RendezvousStore:
    """A listening ``TCPStore`` for one world of ranks, alive as long as this object.

    Args:
        host: the address the ranks reach this process at ("127.0.0.1" for one node; the node's address on a
            Ray cluster). The store listens on every interface of this host.
        timeout_s: how long a rank's ``get`` waits on a key before it raises.
    """

    def __init__(self, host: str = "127.0.0.1", timeout_s: float = 600.0) -> None:
        self._store: dist.TCPStore | None = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                                                           timeout=datetime.timedelta(seconds=timeout_s))
        self.address = f"{host}:{self._store.port}"  # HOST:PORT, what each rank's WorkerSpec carries

    def close(self) -> None:
        """Stop listening (after the ranks are gone); idempotent."""
        self._store = None


def connect_store(address: str, timeout_s: float) -> dist.TCPStore:
    """A client of the rendezvous store at ``address`` ("HOST:PORT").

    Raises:
        RuntimeError (``DistNetworkError``/``DistStoreError`` from torch): the store did not answer within
            ``timeout_s`` seconds.
    """
    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
