"""Waiting queues of the scheduling policies: first-come-first-served, or by (priority, arrival) for
``--scheduling-policy priority``. Each policy also names the running request it preempts first."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Sequence

from brigade.core.request import Request


class FcfsQueue:
    """Arrival order; preempted requests go back to the front."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    @staticmethod
    def victim_index(running: Sequence[Request]) -> int:
        """Index in ``running`` (non-empty, in admission order) of the request to preempt first: the last one
        admitted."""
        return len(running) - 1


class PriorityQueue:
    """Lowest (priority, arrival_time) first; a preempted request keeps its place by its own key."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    prepend = add

    def peek(self) -> Request:
        return self._heap[0]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)

    def remove(self, request: Request) -> None:
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))

    @staticmethod
    def victim_index(running: Sequence[Request]) -> int:
        """Index in ``running`` (non-empty) of the request to preempt first: the lowest priority (largest
        ``priority`` value), then the latest arrival, as vLLM v1 picks it; a full tie goes to the one admitted
        last."""
        return max(range(len(running)), key=lambda i: (running[i].priority, running[i].arrival_time, i))


def make_request_queue(policy: str) -> FcfsQueue | PriorityQueue:
    """Build the waiting queue for a scheduling policy name ("fcfs" or "priority")."""
    return PriorityQueue() if policy == "priority" else FcfsQueue()
