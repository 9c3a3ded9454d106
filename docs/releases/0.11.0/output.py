"""What one scheduling step hands to the worker.

Mirrors: vllm/v1/core/sched/output.py (SchedulerOutput, NewRequestData,
CachedRequestData), reduced to the fields this model produces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference.structured_output import GrammarBatch


@dataclass
class NewRequestData:
    """A request scheduled for the first time: the worker gets its whole table."""

    req_id: str
    block_ids: list[list[int]]  # one list per KV cache group
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """A running request (only its new pages) or a resumed one (its whole table)."""

    req_id: str
    resumed_from_preemption: bool
    new_block_ids: list[list[int]] | None  # one list per group; None: no new pages at all
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    # Insertion order is the order tokens were granted in.
    num_scheduled_tokens: dict[str, int]
    scheduled_spec_decode_tokens: dict[str, list[int]]
    # Requests that finished since the previous schedule() call.
    finished_req_ids: set[str] = field(default_factory=set)
    # Structured output: batch indices of the constrained requests, and bitmask rows.
    grammar: GrammarBatch = field(default_factory=GrammarBatch)
    # Multimodal: the items each request's encoder runs on now, and the content hashes
    # evicted from the encoder cache since the last step.
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    free_encoder_mm_hashes: list[str] = field(default_factory=list)
