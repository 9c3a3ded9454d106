"""Pages per request: prefix lookup, allocation, caching of full pages, freeing.

Mirrors: vllm/v1/core/kv_cache_manager.py (KVCacheManager, KVCacheBlocks).
The work per KV cache group is done by ``reference.group_managers``, and
``reference.kv_cache_coordinator`` adds the groups up.

A request has one block table per group.  Tables grow while the request
runs, sliding-window and chunked-local tables also give back pages that fell
out of the window (the null page takes their place), and all of them are
dropped when the request finishes or is preempted.
"""

from __future__ import annotations

from reference import events
from reference.block_pool import BlockPool
from reference.kv_cache_coordinator import KVCacheCoordinator, PerGroup
from reference.kv_cache_spec import CHUNKED_LOCAL, SLIDING_WINDOW, KVCacheSpec, full
from reference.kv_events import KVEvent
from reference.request import Request
from reference.stats import PrefixCacheStats, kv_cache_usage


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool, use_eagle: bool, emit: events.Listener = events.ignore,
                 groups: tuple[KVCacheSpec, ...] | None = None, enable_kv_cache_events: bool = False):
        """``groups``: the KV cache groups, in order (default: one full-attention group);
        ``has``: which rule changes of a later release apply (default: none, 0.11.0);
        ``enable_kv_cache_events``: the pool queues KV cache events (reference.kv_events)."""
        self.groups = groups or (full(block_size),)
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.emit = emit
        if enable_caching:
            assert len({g.block_size for g in self.groups}) == 1, "one block size with caching"
        self.block_size = self.groups[0].block_size
        self.pool = BlockPool(num_blocks, enable_caching, emit, enable_kv_cache_events)
        self.coordinator = KVCacheCoordinator(self.groups, self.pool, enable_caching, use_eagle)
        self.prefix_cache_stats = PrefixCacheStats()
        # Tokens scheduled and not yet applied at most (see admission_bound).
        self.tokens_in_flight = 0
        # Groups that give pages back, whose need a whole-sequence count may cap.
        self.has_window_groups = any(g.kind in (SLIDING_WINDOW, CHUNKED_LOCAL)
                                     for g in self.groups)

    # -- prefix lookup -----------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[PerGroup, int]:
        """Cached pages holding a prefix of the request (per group), and the tokens they cover."""
        if self.skips_prefix_cache(request):
            hits, num_hit = self.coordinator.empty(), 0
        else:
            hits, num_hit = self.coordinator.lookup(request.block_hashes,
                                                    self.max_hit_tokens(request))
            if not self.counts_at_admission():
                self.count_lookup(request, num_hit)
        self.emit(events.PrefixLookup(request.request_id, num_hit))
        return hits, num_hit

    def skips_prefix_cache(self, request: Request) -> bool:
        """No lookup without caching, nor for prompt logprobs (every prompt token is computed)."""
        return not self.enable_caching or request.wants_prompt_logprobs

    def max_hit_tokens(self, request: Request) -> int:
        """At least the last token is recomputed, to get logits from it."""
        return request.num_tokens - 1

    # -- allocation ----------------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: PerGroup | list | None = None,
                       num_lookahead_tokens: int = 0,
                       delay_caching: bool = False,
                       num_external_tokens: int = 0,
                       reserved_blocks: int = 0) -> PerGroup | None:
        """Give the request pages for its new tokens (per group); None when the pool is short.

        First the pages that fell out of a window are given back.  Slots are
        then needed for the computed tokens, the prefix hit, the new tokens and
        the lookahead, capped at ``max_model_len``; the groups' page counts are
        added up and compared with the free queue, less ``reserved_blocks``.  (A
        running request whose tables have the slots already, as in most decode
        steps, needs no count: it takes no page.)  On success, pages that
        became full are cached, up to the request's real tokens (never its drafts) --
        unless ``delay_caching``: a KV connector fills them later (``cache_blocks``).
        """
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        rid = request.request_id
        self.coordinator.remove_skipped_blocks(rid, self.processed_tokens(request))
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_slots = min(num_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        with_loaded = num_computed + num_external_tokens  # ``num_new_tokens`` holds the loaded ones
        if new_computed_blocks is None and not reserved_blocks \
                and self.coordinator.has_room(rid, num_slots):
            new_blocks = self.coordinator.no_pages  # every group's count is 0 or less: it fits
        else:
            hits = new_computed_blocks or self.coordinator.empty()
            if self.coordinator.pages_to_allocate(rid, num_slots, hits, with_loaded,
                                                  self.allocation_bound()) \
                    > self.pool.num_free_blocks() - reserved_blocks:
                return None
            if self.enable_caching and any(hits):
                self.pool.touch(block for hit in hits for block in hit)
            self.coordinator.save_hits(rid, hits, with_loaded)
            new_blocks = self.coordinator.grow(rid, num_slots)
        if self.enable_caching and not delay_caching:
            self.coordinator.cache_blocks(request, min(num_computed + num_new_tokens,
                                                       request.num_tokens))
        return new_blocks

    def admission_bound(self) -> tuple[int, int] | None:
        """(tokens in flight, max_model_len) when a whole-sequence count caps the window
        groups (from 0.20.2, window_admission_capped), else None.  The scheduler sets
        ``tokens_in_flight``: a step's budget, from 0.26.0 times the batches in flight."""
        return None

    def allocation_bound(self) -> tuple[int, int] | None:
        """The admission cap, counted at every allocation as well in 0.20.0 and 0.20.1
        (window_cap_on_every_allocation), else None.  A running request's window pages
        are then counted up to the cap while the pages it takes are not, so a pool short
        by those pages passes the count and fails as the pages are taken (ValueError)."""
        return None

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's pages that ``num_computed_tokens`` fill (a finished load)."""
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    # -- release -------------------------------------------------------------------

    def free(self, request: Request) -> None:
        """Return the request's pages to the pool."""
        self.coordinator.free(request.request_id)

    def remove_skipped_blocks(self, request: Request, num_tokens: int) -> None:
        """Give back the pages out of every group's window for ``num_tokens`` tokens."""
        self.coordinator.remove_skipped_blocks(request.request_id, num_tokens)

    def processed_tokens(self, request: Request, num_tokens: int | None = None) -> int:
        """The computed tokens (or ``num_tokens``) whose window decides which pages a
        window group gives back.  From 0.26.0 (window_frees_wait_for_outputs) those of
        batches whose output is not applied yet (async scheduling, pipeline stages) do
        not count: their steps may still read the pages."""
        num_tokens = request.num_computed_tokens if num_tokens is None else num_tokens
        return num_tokens

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        """The request's whole block tables, one list per group (null pages as 0)."""
        return block_ids(self.coordinator.tables(request_id))

    def reset_prefix_cache(self) -> bool:
        done = self.pool.reset_prefix_cache()
        if done:
            self.prefix_cache_stats.reset = True
        return done

    # -- stats ---------------------------------------------------------------------

    def counts_apart(self, request: Request) -> bool:
        """From 0.11.1 (prefix_stats_split_preempted) the lookups of a request that was
        preempted before are counted apart from those of new requests."""
        return False

    def counts_at_admission(self) -> bool:
        """When a prefix lookup is counted.  Up to 0.26.0 when it is made, so a waiting
        request looked up at every step until it is admitted (or set aside, or refused
        pages) counts every time.  From 0.27.0 (prefix_stats_counted_at_admission) only the
        lookup of the step whose allocation succeeds is counted, once."""
        return False

    def count_lookup(self, request: Request, num_hit: int) -> None:
        self.prefix_cache_stats.observe(request.num_tokens, num_hit,
                                        preempted=self.counts_apart(request))

    def lookup_admitted(self, request: Request, num_hit: int) -> None:
        """The scheduler allocated the pages of a request it looked up this step."""
        if self.counts_at_admission() and not self.skips_prefix_cache(request):
            self.count_lookup(request, num_hit)

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """The lookups since the last report; counting starts again from zero."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def take_events(self) -> list[KVEvent]:
        """The KV cache events queued since the last call."""
        return self.pool.kv_events.take()

    def usage(self) -> float:
        return kv_cache_usage(self.pool.num_blocks, self.pool.num_free_blocks())


def block_ids(blocks: PerGroup) -> list[list[int]]:
    return [[b.block_id for b in group] for group in blocks]
