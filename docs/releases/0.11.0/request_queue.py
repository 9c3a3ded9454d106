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


class FcfsQueue(deque):
    """A deque of requests, the head first (a deque keeps ``len`` as cheap as can be: the
    scheduler asks for the queues' lengths several times a step)."""

    def add(self, request: Request) -> None:
        self.append(request)

    def peek(self) -> Request:
        return self[0]

    def pop(self) -> Request:
        """The head (not a deque's tail)."""
        return self.popleft()

    def prepend(self, request: Request) -> None:
        self.appendleft(request)

    def prepend_all(self, other: "FcfsQueue", reverse: bool = False) -> None:
        """Put ``other`` in front of this queue, in ``other``'s order (up to 0.13.0) or in
        reverse (0.14.0 and later)."""
        self.extendleft(other if reverse else reversed(other))

    def remove_all(self, requests: Iterable[Request]) -> None:
        gone = set(requests)
        kept = [r for r in self if r not in gone]
        self.clear()
        self.extend(kept)


class PriorityQueue(list):
    """Smallest (priority, arrival_time) first: a heap (a list, for a cheap ``len``) of
    entries ``(priority, arrival_time, id, request)``; iterating gives the requests."""

    def add(self, request: Request) -> None:
        # The keys are unique in the harness (arrival_time is the stream index);
        # id() only keeps heapq from ever comparing two Request objects.
        heapq.heappush(self, (request.priority, request.arrival_time, id(request), request))

    def peek(self) -> Request:
        return self[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self)[-1]

    def prepend(self, request: Request) -> None:
        """Under priority a request put back goes where its key puts it, as any other."""
        self.add(request)

    def prepend_all(self, other: "PriorityQueue", reverse: bool = False) -> None:
        for entry in other.entries():
            self.add(entry[-1])

    def remove_all(self, requests: Iterable[Request]) -> None:
        gone = set(requests)
        self[:] = [e for e in self.entries() if e[-1] not in gone]
        heapq.heapify(self)

    def entries(self) -> Iterator[tuple[int, float, int, Request]]:
        return list.__iter__(self)

    def __iter__(self) -> Iterator[Request]:
        return (e[-1] for e in sorted(self.entries()))


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
