"""The engine interface: what the step loop needs from vLLM and from the reference.

Both engines turn one ``schedule()`` call into a :class:`Scheduled` record with
plain Python values (no vLLM types), so the step loop, the scripted model and
the trace writer are shared and never know which engine they drive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from harness.stream import RequestSpec, Stream


@dataclass
class Scheduled:
    """What one ``schedule()`` call decided, in engine-neutral form."""

    # [(req_id, n_tokens)] in the order of vLLM's num_scheduled_tokens dict.
    scheduled: list[tuple[str, int]]
    # {req_id: [[block ids of group 0]]} as handed to the worker.
    new_block_ids: dict[str, list[list[int]]]
    # Request ids preempted during this schedule() call, in order.
    preempted: list[str]
    # finished_req_ids carried by this step's output.
    finished: list[str]
    # {req_id: tokens found in the prefix cache} for requests admitted this step.
    prefix_hit_tokens: dict[str, int]
    # {req_id: scheduled draft tokens}.
    spec_tokens: dict[str, list[int]]
    # Per scheduled request: num_computed_tokens as the worker sees it before
    # this step's tokens, the request's num_tokens (prompt + outputs) and its
    # number of outputs so far.  The scripted model reads these.
    computed_before: dict[str, int]
    num_tokens: dict[str, int]
    num_outputs: dict[str, int]
    # Cached pages whose hash was dropped because they were reused, in order.
    evicted: list[int] = field(default_factory=list)
    # {req_id: [[first_slot, last_slot_exclusive], ...]} KV slots written this step.
    slots: dict[str, list[list[int]]] = field(default_factory=dict)


@dataclass
class RequestState:
    """A request's state after a step, read for the trace."""

    status: str  # WAITING, RUNNING, PREEMPTED, FINISHED_STOPPED, ...
    num_computed_tokens: int
    num_output_tokens: int


class Engine(Protocol):
    """One scheduler + KV cache manager, driven step by step."""

    name: str

    def start(self, stream: Stream) -> None:
        """Build a fresh scheduler and cache for this stream's config."""

    def version(self) -> str:
        """The vLLM version this engine is (or mirrors)."""

    def reset_prefix_cache(self) -> bool: ...

    def abort(self, req_id: str) -> None: ...

    def add(self, req: RequestSpec, arrival_index: int) -> None: ...

    def num_unfinished(self) -> int: ...

    def schedule(self) -> Scheduled: ...

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]]) -> None:
        """Feed the scripted model's tokens back (vLLM's update_from_output)."""

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        """vLLM's update_draft_token_ids."""

    def state(self, req_id: str) -> RequestState: ...

    def num_free_blocks(self) -> int: ...
