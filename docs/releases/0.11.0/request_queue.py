"""The waiting queue under each policy.

Mirrors: vllm/v1/core/sched/request_queue.py (FCFSRequestQueue,
PriorityRequestQueue).

fcfs is a deque: arrivals at the tail, preempted and skipped requests back at
the head.  priority is a heap on (priority, arrival_time): "prepending" is
just another push, so a preempted request goes back by its key, not first.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterable, Iterator

from reference.request import Request


class FcfsQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._q.append(request)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def prepend(self, request: Request) -> None:
        self._q.appendleft(request)

    def prepend_all(self, other: "FcfsQueue", reverse: bool = False) -> None:
        """Put ``other`` in front of this queue, in ``other``'s order (up to 0.13.0) or in
        reverse (0.14.0 and later)."""
        self._q.extendleft(other._q if reverse else reversed(other._q))

    def remove_all(self, requests: Iterable[Request]) -> None:
        gone = set(requests)
        self._q = deque(r for r in self._q if r not in gone)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    """Smallest (priority, arrival_time) first."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def add(self, request: Request) -> None:
        # The keys are unique in the harness (arrival_time is the stream index);
        # id() only keeps heapq from ever comparing two Request objects.
        heapq.heappush(self._heap, (request.priority, request.arrival_time, id(request), request))

    def peek(self) -> Request:
        return self._heap[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def prepend(self, request: Request) -> None:
        """Under priority a request put back goes where its key puts it, as any other."""
        self.add(request)

    def prepend_all(self, other: "PriorityQueue", reverse: bool = False) -> None:
        for entry in other._heap:
            self.add(entry[-1])

    def remove_all(self, requests: Iterable[Request]) -> None:
        gone = set(requests)
        self._heap = [e for e in self._heap if e[-1] not in gone]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[-1] for e in sorted(self._heap))


RequestQueue = FcfsQueue | PriorityQueue


def runs_before(a: Request, b: Request) -> bool:
    """vLLM's order of requests: priority, then arrival, then request id."""
    return (a.priority, a.arrival_time, a.request_id) < (b.priority, b.arrival_time, b.request_id)


def make_queue(policy: str) -> RequestQueue:
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}")
