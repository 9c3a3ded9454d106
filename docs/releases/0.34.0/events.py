"""Trace events: what the scheduler tells an observer, and the do-nothing default.

The scheduler, the KV cache manager and the block pool call ``emit`` with
one of the event records below.  By default nothing listens; the harness
installs a recorder.  These are the facts vLLM's ``SchedulerOutput`` does not
carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union


@dataclass(frozen=True)
class Preempted:
    request_id: str


@dataclass(frozen=True)
class PrefixLookup:
    """A waiting request looked for its prefix in the cache and found this many tokens."""

    request_id: str
    num_hit_tokens: int


@dataclass(frozen=True)
class CachedBlockEvicted:
    """A cached page was taken for new use, so its hash was dropped."""

    block_id: int


@dataclass(frozen=True)
class SetAside:
    """A waiting request was passed over this step and goes back to the queue's head."""

    request_id: str


Event = Union[Preempted, PrefixLookup, CachedBlockEvicted, SetAside]
Listener = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The default listener."""
