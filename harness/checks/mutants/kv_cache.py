"""Mutants of the block pool, the KV cache manager, the per-type managers of hybrid models
and their coordinator."""

from __future__ import annotations

from harness.checks.mutants.applies import (
    caching,
    chunked_local,
    chunked_local_caching,
    drafts_and_caching,
    eagle_and_caching,
    hybrid_caching,
    lora_and_caching,
    mamba_drafts,
    priority_windows,
    several_groups,
    sliding,
    sliding_caching,
    sliding_drafts_caching,
)
from harness.checks.mutants.registry import mutant, register
from harness.formats.mutant import (
    BLOCK_POOL,
    KV_CACHE_COORDINATOR,
    KV_CACHE_MANAGER,
    KV_CACHE_UTILS,
    SINGLE_TYPE,
)
from reference import block_hash as rhash
from reference import block_pool as rbp
from reference import group_managers as rgm
from reference import kv_cache_coordinator as rkc
from reference import kv_cache_manager as rkv


@mutant("free_forward_order", "a request's pages are freed tail first", SINGLE_TYPE,
        replaces=(rgm.GroupManager, "free_order"))
def _head_first(self, table):
    return table


@mutant("evict_from_tail", "new pages come from the head of the free queue", KV_CACHE_UTILS,
        replaces=(rbp.FreeBlockQueue, "next_to_go"))
def _most_recently_freed(self):
    return self._tail.prev_free


@mutant("hit_without_last_token_cap", "a prefix hit leaves at least the last token to compute",
        KV_CACHE_MANAGER, replaces=(rkv.KVCacheManager, "max_hit_tokens"), applies=caching)
def _whole_request(self, request):
    return request.num_tokens


_full_hit = rgm.FullAttentionManager.find_longest_cache_hit.__func__


def _rounded_up_to_a_page(cls, block_hashes, max_length, group_ids, pool, spec, use_eagle):
    rounded = rgm.cdiv(max_length, spec.block_size) * spec.block_size
    return _full_hit(cls, block_hashes[:rounded // spec.block_size], rounded, group_ids, pool,
                     spec, use_eagle)


register("hit_on_partial_block", "prefix hits cover whole pages within num_tokens - 1",
         SINGLE_TYPE, replaces=(rgm.FullAttentionManager, "find_longest_cache_hit"),
         new=classmethod(_rounded_up_to_a_page), applies=caching)


@mutant("eagle_keeps_last_hit", "eagle drops the last hit page", SINGLE_TYPE,
        replaces=(rgm, "trim_hit_for_eagle"), applies=eagle_and_caching)
def _keep_every_hit(hits, use_eagle):
    return None


@mutant("prompt_logprobs_get_hits", "requests with prompt logprobs skip the prefix cache",
        KV_CACHE_MANAGER, replaces=(rkv.KVCacheManager, "skips_prefix_cache"), applies=caching)
def _only_without_caching(self, request):
    return not self.enable_caching


@mutant("cache_salt_ignored", "cache_salt is an extra key of the first block", KV_CACHE_UTILS,
        replaces=(rhash, "salt_keys"), applies=caching)
def _no_salt_keys(cache_salt, block_start):
    return ()


@mutant("lora_not_in_hash", "a LoRA adapter's id is an extra key of every block", KV_CACHE_UTILS,
        replaces=(rhash, "lora_keys"), applies=lora_and_caching)
def _no_lora_keys(lora_id):
    return ()


_extend_block_hashes = rhash.extend_block_hashes


@mutant("cache_draft_tokens", "only real tokens are cached, never drafts", KV_CACHE_MANAGER,
        replaces=(rgm.GroupManager, "cache_blocks"), applies=drafts_and_caching)
def _cache_with_drafts(self, request, num_tokens):
    # Treat drafts as final: hash and cache the pages they fill too.
    tokens = request.all_token_ids + request.spec_token_ids
    hashes = list(request.block_hashes)
    _extend_block_hashes(hashes, tokens, self.block_size, request.hash_inputs)
    num_full = min(num_tokens + len(request.spec_token_ids), len(tokens)) // self.block_size
    num_cached = self.num_cached_block[request.request_id]
    self.pool.cache_full_blocks(hashes, self.table(request.request_id), num_cached, num_full,
                                self.group_id, request, self.block_size)
    self.num_cached_block[request.request_id] = max(num_full, num_cached)


@mutant("free_hits_not_counted", "prefix hits on free pages count as pages to allocate",
        SINGLE_TYPE, replaces=(rgm.GroupManager, "free_hit_pages"), applies=caching)
def _no_free_hits(self, hit):
    return 0


@mutant("hash_kept_on_reuse", "a cached page handed out again loses its hash", BLOCK_POOL,
        replaces=(rbp.BlockPool, "_evict_if_cached"), applies=caching)
def _keep_hash(self, block):
    return None


_pool_init = rbp.BlockPool.__init__


_window_pages = rgm.window_pages


@mutant("window_pages_whole_window", "a sliding-window hit needs the pages of sliding_window - 1 "
        "tokens", SINGLE_TYPE, replaces=(rgm, "window_pages"), applies=sliding_caching)
def _pages_of_whole_window(spec):
    return rgm.cdiv(spec.sliding_window, spec.block_size)


def _as_full_attention(cls, block_hashes, max_length, group_ids, pool, spec, use_eagle):
    # Look up like full attention: the leading cached run from the first page.
    return _full_hit(cls, block_hashes, max_length, group_ids, pool, spec, use_eagle)


register("window_hit_from_left", "sliding-window hits are searched from the right", SINGLE_TYPE,
         replaces=(rgm.SlidingWindowManager, "find_longest_cache_hit"),
         new=classmethod(_as_full_attention), applies=sliding_caching)


@mutant("window_pages_kept", "pages that leave the sliding window are freed", SINGLE_TYPE,
        replaces=(rgm.SlidingWindowManager, "remove_skipped_blocks"), applies=sliding)
def _keep_window_pages(self, request_id, num_computed_tokens):
    return None


@mutant("window_edge_off_by_one", "the window of the next token holds sliding_window tokens, "
        "itself included", SINGLE_TYPE, replaces=(rgm.SlidingWindowManager,
                                                  "remove_skipped_blocks"), applies=sliding)
def _window_one_token_shorter(self, request_id, num_computed_tokens):
    self.null_out_before(request_id,
                         (num_computed_tokens - self.spec.sliding_window + 2) // self.block_size)


_null_out_before = rgm.GroupManager.null_out_before


@mutant("window_walk_capped_to_table", "up to 0.13.0 the walk back from the window's first "
        "page indexes the block table as it is, so a table shorter than the window's skipped "
        "pages (a priority victim's stale grant) raises IndexError", SINGLE_TYPE,
        replaces=(rgm.GroupManager, "null_out_before"), quirk="PRIORITY_VICTIM_INDEX_ERROR",
        applies=priority_windows)
def _walk_inside_the_table(self, request_id, first_kept):
    # 0.14.0's cap, on every release: the stale grant then frees nothing and the run goes on.
    _null_out_before(self, request_id, min(first_kept, len(self.table(request_id))))


register("chunk_hit_from_start", "a chunked-local hit starts at the chunk of the next token",
         SINGLE_TYPE, replaces=(rgm.ChunkedLocalAttentionManager, "find_longest_cache_hit"),
         new=classmethod(_as_full_attention), applies=chunked_local_caching)


@mutant("chunk_pages_kept", "pages of earlier chunks are freed", SINGLE_TYPE,
        replaces=(rgm.ChunkedLocalAttentionManager, "remove_skipped_blocks"),
        applies=chunked_local)
def _keep_chunk_pages(self, request_id, num_computed_tokens):
    return None


@mutant("chunk_frees_last_cached_page", "chunked local attention keeps the last cached page",
        SINGLE_TYPE, replaces=(rgm.ChunkedLocalAttentionManager, "remove_skipped_blocks"),
        applies=chunked_local_caching)
def _free_the_last_cached_page_too(self, request_id, num_computed_tokens):
    chunk = self.spec.attention_chunk_size
    self.null_out_before(request_id, num_computed_tokens // chunk * chunk // self.block_size)


@mutant("mamba_draft_pages_ignored", "a Mamba group keeps one extra page per speculative token",
        SINGLE_TYPE, replaces=(rgm.MambaManager, "slots_needed"), applies=mamba_drafts)
def _one_state_page(self, num_tokens):
    return num_tokens


_hybrid_hit = rkc.KVCacheCoordinator.hybrid_hit


@mutant("hybrid_full_hit_not_cut", "the full-attention hit is cut to the other groups' hit",
        KV_CACHE_COORDINATOR, replaces=(rkc.KVCacheCoordinator, "hybrid_hit"),
        applies=hybrid_caching)
def _full_hit_kept_whole(self, block_hashes, max_length):
    full = self.managers[self.full_ids[0]]
    other = self.managers[self.other_ids[0]]
    full_hits = full.find_longest_cache_hit(block_hashes, max_length, self.full_ids, self.pool,
                                            full.spec, self.use_eagle)
    hit_length = len(full_hits[0]) * full.block_size
    other_hits = other.find_longest_cache_hit(block_hashes, hit_length, self.other_ids,
                                              self.pool, other.spec, self.use_eagle)
    return rkc.merge_in_group_order(self.full_ids, full_hits, self.other_ids, other_hits), \
        len(other_hits[0]) * other.block_size


@mutant("hybrid_other_hit_unbounded", "the other groups' hit is searched within the full hit",
        KV_CACHE_COORDINATOR, replaces=(rkc.KVCacheCoordinator, "hybrid_hit"),
        applies=hybrid_caching)
def _other_hit_over_the_whole_prompt(self, block_hashes, max_length):
    full = self.managers[self.full_ids[0]]
    other = self.managers[self.other_ids[0]]
    other_hits = other.find_longest_cache_hit(block_hashes, max_length, self.other_ids,
                                              self.pool, other.spec, self.use_eagle)
    hit_length = len(other_hits[0]) * other.block_size
    full_hits = full.find_longest_cache_hit(block_hashes, hit_length, self.full_ids,
                                            self.pool, full.spec, self.use_eagle)
    hit_length = len(full_hits[0]) * full.block_size
    for hit in other_hits:
        del hit[hit_length // other.block_size:]
    return rkc.merge_in_group_order(self.full_ids, full_hits, self.other_ids, other_hits), \
        hit_length


@mutant("groups_freed_last_first", "a request's groups are freed in group order",
        KV_CACHE_COORDINATOR, replaces=(rkc.KVCacheCoordinator, "free"), applies=several_groups)
def _free_last_group_first(self, request_id):
    for m in reversed(self.managers):
        m.free(request_id)


_cache_full_blocks = rbp.BlockPool.cache_full_blocks


@mutant("null_page_never_cached", "0.11.0 indexes a null page that took an uncached page's place",
        BLOCK_POOL, replaces=(rbp.BlockPool, "cache_full_blocks"), quirk="NULL_PAGE_CACHED",
        applies=sliding_drafts_caching)
def _skip_null_pages(self, block_hashes, blocks, num_cached, num_full, group_id=0,
                     request=None, block_size=0, indexed=True):
    if not any(b.is_null for b in blocks[num_cached:num_full]):
        return _cache_full_blocks(self, block_hashes, blocks, num_cached, num_full, group_id,
                                  request, block_size)
    for i in range(num_cached, num_full):
        if not blocks[i].is_null:
            _cache_full_blocks(self, block_hashes, blocks, i, i + 1, group_id, request,
                               block_size)


_get_cached_block = rbp.BlockPool.get_cached_block


@mutant("cache_key_without_group", "a page is cached under its hash and its group", BLOCK_POOL,
        replaces=(rbp.BlockPool, "get_cached_block"), applies=hybrid_caching)
def _any_group_s_page(self, block_hash, group_ids):
    # Look up the first group's key for every group: another group's page can be hit.
    return _get_cached_block(self, block_hash, [group_ids[0]] * len(group_ids))


@mutant("no_null_block", "page 0 is the null page, never handed out", BLOCK_POOL,
        replaces=(rbp.BlockPool, "__init__"))
def _page_zero_in_the_free_queue(self, *args, **kwargs):
    _pool_init(self, *args, **kwargs)
    self.null_block.is_null = False  # page 0 handed out like any other, first
    self.free_queue = rbp.FreeBlockQueue(self.blocks)


@mutant("reset_prefix_cache_always", "reset_prefix_cache is refused while pages are in use",
        BLOCK_POOL, replaces=(rbp.BlockPool, "can_reset_prefix_cache"))
def _always_resettable(self):
    return True
