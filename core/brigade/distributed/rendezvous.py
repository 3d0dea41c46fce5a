"""The rendezvous store: the ``torch.distributed`` key-value store every rank of one engine meets at (or, when
data-parallel engines step in lockstep, every rank of every engine, and the engines themselves).

The executor (the front end, for lockstep engines) hosts it, in its own process, on a port the operating system
assigns when the store starts listening (``TCPStore`` on port 0), and hands its ``HOST:PORT`` to each rank; the
ranks connect to it as clients. Probing for a free port and letting rank 0 bind it later races with every other
process on the host that binds a port in between (``EADDRINUSE`` at start-up, seen when several engines start at
once); a store that is already listening cannot lose its port.
"""

from __future__ import annotations

import datetime

import torch
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


class StatelessGroup:
    """A gloo group of ``size`` processes outside ``torch.distributed``'s default world (vLLM's stateless
    process group), so that a process may join it and a world of its own: the lockstep group of the DP engines
    (one rank per EngineCore process), beside the world of their workers, which may run in the same process.

    Args:
        address: ``HOST:PORT`` of the rendezvous store (``RendezvousStore``).
        prefix: the group's key prefix in the store (the world's keys never collide with it).
        rank, size: this process's rank in the group and the group's size.
        timeout_s: how long the rendezvous and each collective may stall before they raise.
    Raises:
        RuntimeError (from torch): the store did not answer, or a peer did not join within ``timeout_s``.
    """

    def __init__(self, address: str, prefix: str, rank: int, size: int, timeout_s: float):
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.PrefixStore(prefix, connect_store(address, timeout_s))
        self.rank, self.size = rank, size
        self._group = dist.ProcessGroupGloo(store, rank, size, timeout)

    def all_reduce_max(self, values: list[int]) -> list[int]:
        """The elementwise maximum of every member's ``values`` (the same length on each), on the CPU.

        Raises:
            RuntimeError (from gloo): a peer closed its connection (its process died) or stalled past the
                timeout.
        """
        tensor = torch.tensor(values, dtype=torch.int64)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self._group.allreduce([tensor], options).wait()
        return tensor.tolist()
