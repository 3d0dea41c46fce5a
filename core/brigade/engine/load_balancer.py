"""LoadBalancer: which data-parallel engine gets each new request, and which engine owns each request in flight.

vLLM's DP load balancing (its ``DPLBAsyncMPClient``) picks the engine with the fewest requests by the latest
counts the engines report, and adds on the client side what it has sent since, so that a burst of requests
arriving between two reports spreads over the engines instead of piling on the one that looked idle. Here an
engine's load is

    running + waiting (at its last report) + requests sent to it that it had not yet taken at that report,

where the last term is exact: every message an engine sends carries how many requests it has taken so far
(``EngineCoreOutputs.num_requests_received``), and this side counts how many it sent. Ties go round-robin, so
requests that arrive one at a time on an idle server alternate between the engines. Plain Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from brigade.interfaces import EngineCoreOutputs, UtilityMethod


class LoadBalancer:
    """Least-loaded routing over ``num_engines`` engines and the owner of each engine request id.

    Invariant: ``owner`` holds exactly the engine request ids sent and neither finished nor aborted.
    """

    def __init__(self, num_engines: int):
        self.num_engines = num_engines
        self.num_reported = [0] * num_engines  # running + waiting at each engine's last report
        self.num_received = [0] * num_engines  # requests each engine had taken at that report
        self.num_sent = [0] * num_engines  # requests sent to each engine
        self.owner: dict[str, int] = {}  # engine request id -> engine index
        self._next = 0  # where the round-robin among equally loaded engines starts

    def load(self, engine: int) -> int:
        """Requests on ``engine`` now, as far as this side knows (see the module docstring)."""
        return self.num_reported[engine] + self.num_sent[engine] - self.num_received[engine]

    def choose(self) -> int:
        """The least-loaded engine; among equals, the first at or after the one after the last choice."""
        order = [(self._next + k) % self.num_engines for k in range(self.num_engines)]
        engine = min(order, key=self.load)
        self._next = (engine + 1) % self.num_engines
        return engine

    def add(self, engine: int, request_ids: Iterable[str]) -> None:
        """Record requests sent to ``engine`` (the children of an ``n > 1`` request all go to one engine, so they
        share its prefix cache)."""
        for request_id in request_ids:
            self.owner[request_id] = engine
            self.num_sent[engine] += 1

    def report(self, outputs: EngineCoreOutputs) -> None:
        """Take an engine's message: its counts (when it carries scheduler stats), and the requests it finished."""
        engine = outputs.engine_index
        stats = outputs.scheduler_stats
        if stats is not None:
            self.num_reported[engine] = stats.num_running_reqs + stats.num_waiting_reqs
            self.num_received[engine] = outputs.num_requests_received
        for output in outputs.outputs:
            if output.finish_reason is not None:
                self.owner.pop(output.request_id, None)

    def take_owners(self, request_ids: Iterable[str]) -> dict[int, list[str]]:
        """The given request ids by owning engine, forgotten here (for aborts); ids not in flight are dropped."""
        by_engine: dict[int, list[str]] = {}
        for request_id in request_ids:
            engine = self.owner.pop(request_id, None)
            if engine is not None:
                by_engine.setdefault(engine, []).append(request_id)
        return by_engine


def merge_utility_results(method: UtilityMethod, results: list):
    """One answer from every engine's answer to a control call sent to all of them.

    RESET_PREFIX_CACHE: True when every engine dropped its cache. GET_KV_CACHE_STATS: the pools' sums. IS_SLEEPING:
    True when all sleep. ADD_LORA and REMOVE_LORA: True when every engine did it (they are sent to all engines,
    so each can run any request on the adapter).
    """
    if method == UtilityMethod.GET_KV_CACHE_STATS:
        return {key: sum(r[key] for r in results) for key in ("num_free_blocks", "num_total_blocks")}
    return all(results)
