"""What the scheduler reports after each step, when it keeps stats.

Mirrors: vllm/v1/metrics/stats.py (SchedulerStats, PrefixCacheStats) and
vllm/v1/spec_decode/metrics.py (SpecDecodingStats), counted where
vllm/v1/core/kv_cache_manager.py and vllm/v1/core/sched/scheduler.py count them.

A server keeps stats unless started with ``--disable-log-stats``; routers and
autoscalers read them.  Each report covers the time since the previous one:
the prefix-cache counts start again from zero after every report.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the last report."""

    reset: bool = False  # the prefix cache was reset
    requests: int = 0  # lookups made
    queries: int = 0  # tokens looked up: each request's whole num_tokens
    hits: int = 0  # tokens found
    # The same three counts for requests preempted before (0.11.1's
    # prefix_stats_split_preempted; 0.11.0 counts them with the others).
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def observe(self, num_tokens: int, num_hit_tokens: int, preempted: bool = False) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hit_tokens
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hit_tokens


@dataclass
class SpecDecodingStats:
    """The drafts checked in one step: how many, and how many of their tokens the model
    accepted, in all and per draft position."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's drafts; the accepted ones are a prefix of them."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for position in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[position] += 1


@dataclass
class SchedulerStats:
    """One report, made at the end of each update_from_output."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    prefix_cache: PrefixCacheStats
    spec_decoding: SpecDecodingStats | None  # None: no drafts were checked this step
    # From 0.20.0 the set-aside queue is counted apart (and not among the waiting).
    num_set_aside: int | None = None


def kv_cache_usage(num_blocks: int, num_free_blocks: int) -> float:
    """The share of the pool in use; the null page counts as neither used nor there."""
    usable = num_blocks - 1
    if not usable:
        return 0
    return 1.0 - (num_free_blocks / usable)
