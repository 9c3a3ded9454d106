"""Mutants of what the scheduler reports: its stats and its KV cache events."""

from __future__ import annotations

import dataclasses

from harness.checks.mutants.applies import (
    kv_events,
    kv_events_lora,
    kv_events_resets,
    stats,
    stats_caching,
    stats_drafts,
)
from harness.checks.mutants.kv_cache import _cache_full_blocks
from harness.checks.mutants.registry import mutant
from harness.formats.mutant import BLOCK_POOL, KV_CACHE_MANAGER, SCHEDULER
from reference import block_pool as rbp
from reference import kv_cache_manager as rkv
from reference import kv_events as rkve
from reference import scheduler as rsched
from reference import stats as rstats

_get_computed_blocks = rkv.KVCacheManager.get_computed_blocks


@mutant("stats_count_skipped_lookups", "a request that skips the prefix cache (caching off, "
        "prompt logprobs) makes no lookup to count", KV_CACHE_MANAGER,
        replaces=(rkv.KVCacheManager, "get_computed_blocks"), applies=stats)
def _every_request_counted(self, request):
    hits, num_hit = _get_computed_blocks(self, request)
    if self.skips_prefix_cache(request):
        self.prefix_cache_stats.observe(request.num_tokens, num_hit)
    return hits, num_hit


_observe = rstats.PrefixCacheStats.observe


@mutant("stats_queries_capped", "a lookup queries the request's whole num_tokens, not only "
        "the tokens it may hit", KV_CACHE_MANAGER,
        replaces=(rstats.PrefixCacheStats, "observe"), applies=stats_caching)
def _queries_without_last_token(self, num_tokens, num_hit_tokens, preempted=False):
    _observe(self, num_tokens - 1, num_hit_tokens, preempted)


@mutant("stats_prefix_cache_cumulative", "each report counts the lookups since the previous "
        "one", KV_CACHE_MANAGER, replaces=(rkv.KVCacheManager, "take_prefix_cache_stats"),
        applies=stats)
def _never_restarted(self):
    return dataclasses.replace(self.prefix_cache_stats)


@mutant("stats_usage_counts_null_page", "KV cache usage leaves the null page out of the pool",
        BLOCK_POOL, replaces=(rkv, "kv_cache_usage"), applies=stats)
def _usage_of_whole_pool(num_blocks, num_free_blocks):
    return 1.0 - (num_free_blocks / num_blocks)


@mutant("stats_reset_not_reported", "a prefix-cache reset is reported in the next stats",
        KV_CACHE_MANAGER, replaces=(rkv.KVCacheManager, "reset_prefix_cache"), applies=stats)
def _reset_unreported(self):
    return self.pool.reset_prefix_cache()


@mutant("stats_drafted_positions_counted", "per draft position, only accepted tokens are "
        "counted", "vllm/v1/spec_decode/metrics.py",
        replaces=(rstats.SpecDecodingStats, "observe_draft"), applies=stats_drafts)
def _every_drafted_position(self, num_draft_tokens, num_accepted_tokens):
    self.num_drafts += 1
    self.num_draft_tokens += num_draft_tokens
    self.num_accepted_tokens += num_accepted_tokens
    for position in range(num_draft_tokens):
        self.num_accepted_tokens_per_pos[position] += 1


_make_stats = rsched.Scheduler.make_stats


@mutant("stats_spec_decoding_always", "a step that checked no drafts reports no "
        "spec-decoding stats", SCHEDULER, replaces=(rsched.Scheduler, "make_stats"),
        applies=stats_drafts)
def _empty_spec_stats_reported(self, spec_decoding):
    if spec_decoding is None and self.config.num_speculative_tokens:
        spec_decoding = rstats.SpecDecodingStats.new(self.config.num_speculative_tokens)
    return _make_stats(self, spec_decoding)


KV_EVENTS = "vllm/distributed/kv_events.py"


@mutant("kv_event_parent_dropped", "a stored run of pages names the hash of the page before "
        "it in the request's table as its parent", BLOCK_POOL,
        replaces=(rbp, "parent_hash"), applies=kv_events)
def _no_parent(blocks, num_cached):
    return None


_evict_if_cached = rbp.BlockPool._evict_if_cached


@mutant("kv_event_removal_not_sent", "a cached page handed out again is announced as removed",
        BLOCK_POOL, replaces=(rbp.BlockPool, "_evict_if_cached"), applies=kv_events)
def _silent_eviction(self, block):
    queue, self.kv_events = self.kv_events, rbp.KVEventQueue(False)
    try:
        _evict_if_cached(self, block)
    finally:
        self.kv_events = queue


_reset_pool = rbp.BlockPool.reset_prefix_cache


@mutant("kv_event_clear_not_sent", "a prefix-cache reset is announced as AllBlocksCleared",
        BLOCK_POOL, replaces=(rbp.BlockPool, "reset_prefix_cache"), applies=kv_events_resets)
def _silent_reset(self):
    done = _reset_pool(self)
    if done and self.kv_events.enabled:
        self.kv_events.pending.pop()
    return done


@mutant("kv_event_stored_per_page", "one BlockStored announces every page one indexing call "
        "caches", BLOCK_POOL, replaces=(rbp.BlockPool, "cache_full_blocks"), applies=kv_events)
def _one_event_per_page(self, block_hashes, blocks, num_cached, num_full, group_id=0,
                        request=None, block_size=0, indexed=True):
    for i in range(num_cached, num_full):
        _cache_full_blocks(self, block_hashes, blocks, i, i + 1, group_id, request, block_size)


@mutant("kv_event_tokens_from_first_page", "a BlockStored carries the tokens of the newly "
        "cached pages only", BLOCK_POOL, replaces=(rbp.BlockPool, "cache_full_blocks"),
        applies=kv_events)
def _tokens_from_first_page(self, block_hashes, blocks, num_cached, num_full, group_id=0,
                            request=None, block_size=0, indexed=True):
    queued = len(self.kv_events.pending)
    _cache_full_blocks(self, block_hashes, blocks, num_cached, num_full, group_id, request,
                       block_size)
    if len(self.kv_events.pending) > queued:
        self.kv_events.pending[-1] = dataclasses.replace(
            self.kv_events.pending[-1],
            token_ids=tuple(request.all_token_ids[:num_full * block_size]))


@mutant("kv_events_with_lora_run", "0.11.0 raises when it announces pages of a request with a "
        "LoRA adapter", BLOCK_POOL, replaces=(rbp.BlockPool, "announced_adapter"),
        quirk="KV_EVENTS_FAIL_WITH_LORA", applies=kv_events_lora)
def _adapter_announced(self, request):
    return request.lora_id


_free_blocks = rbp.BlockPool.free_blocks


@mutant("kv_event_removed_on_free", "freeing a cached page leaves it in the index: no event "
        "until it is reused", BLOCK_POOL, replaces=(rbp.BlockPool, "free_blocks"),
        applies=kv_events)
def _removed_when_freed(self, ordered, uncached_first=False):
    ordered = list(ordered)
    _free_blocks(self, ordered, uncached_first)
    for block in ordered:
        if block.ref_cnt == 0 and block.block_hash is not None and not block.is_null:
            self.kv_events.put(rkve.BlockRemoved((block.block_hash[0],)))
