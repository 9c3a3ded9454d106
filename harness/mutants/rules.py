"""The reference's mutants: each breaks one named rule of the reference.

Every mutant is registered right above the function that replaces the rule:
``@mutant(name, rule, mirrors, replaces=(owner, attribute))``, where ``rule``
states the rule as the original keeps it and ``mirrors`` is the vLLM 0.11.0
module it lives in.  The replacement is active only inside ``mutant.patch()``.
"""

from __future__ import annotations

import dataclasses
import heapq

from harness.patches import (BLOCK_POOL, KV_CACHE_COORDINATOR, KV_CACHE_MANAGER, KV_CACHE_UTILS,
                             MODEL_CONFIG,
                             REQUEST, REQUEST_QUEUE, SCHED_UTILS, SCHEDULER, SINGLE_TYPE,
                             WORKER_BLOCK_TABLE, Mutant, replace)
from harness.patches import HYBRID_MODEL_CONFIG, KV_CACHE_INTERFACE, STRUCTURED_OUTPUT, VLLM_CONFIG
from reference import block_hash as rhash
from reference import block_pool as rbp
from reference import async_scheduler as rasync
from reference import config as rconfig
from reference import engine_core as rengine
from reference import encoder_cache as renc
from reference import encoder_inputs as rencin
from reference import group_managers as rgm
from reference import kv_cache_coordinator as rkc
from reference import kv_cache_manager as rkv
from reference import kv_events as rkve
from reference import kv_sizing as rkvs
from reference import kv_sizing_hybrid as rkvh
from reference import lora as rlora
from reference import request as rreq
from reference import request_queue as rq
from reference import scheduler as rsched
from reference import releases
from reference import slot_mapping as rslots
from reference import stats as rstats
from reference import structured_output as rso
from reference.request import RequestStatus

MUTANTS: list[Mutant] = []


#: Mutants whose site only answers a question -- it reads what it is given and changes
#: nothing -- and whose replacement does the same (harness.patches.Replacement.question):
#: the rule report compares the two answers call by call instead of running the mutant
#: on every stream (harness.decided).  tests/test_reach.py checks the claim.
QUESTIONS = frozenset({
    "evict_from_tail", "hit_without_last_token_cap", "hit_on_partial_block",
    "prompt_logprobs_get_hits", "cache_salt_ignored", "lora_not_in_hash",
    "free_hits_not_counted", "window_pages_whole_window", "window_hit_from_left",
    "chunk_hit_from_start", "mamba_draft_pages_ignored", "hybrid_full_hit_not_cut",
    "hybrid_other_hit_unbounded", "cache_key_without_group", "reset_prefix_cache_always",
    "fcfs_preempt_first_running", "fcfs_victim_newest_arrival", "fcfs_victim_by_id",
    "priority_victim_by_arrival_only", "priority_victim_by_id",
    "waiting_admitted_after_preemption", "priority_quirk_fixed", "model_len_cap_off_by_one",
    "threshold_ignored_when_waiting", "max_num_seqs_off_by_one", "set_aside_before_threshold",
    "resumed_prompt_only", "eagle_no_lookahead", "drafts_not_trimmed",
    "rejected_drafts_not_subtracted", "eos_ignored", "slot_offset_ignored",
    "lora_slots_ignored", "lora_same_adapter_turned_away", "drafts_not_validated",
    "grammar_batch_running_first", "mm_hash_not_in_block_hash",
    "mm_item_ending_at_block_start_skipped", "mm_later_hashing_from_first_item",
    "encoder_budget_not_raised_to_largest_item", "chunked_mm_input_allowed",
    "stats_usage_counts_null_page", "kv_event_parent_dropped", "kv_events_with_lora_run",
    "loaded_last_token_not_recomputed", "engine_steps_while_idle",
    "finished_told_only_with_work", "batch_applied_at_once", "worker_done_not_looked_at",
    "empty_batch_does_not_wait", "pipeline_stages_ignored", "placeholders_not_scheduled",
    "sampling_ignores_placeholders",
})


def mutant(name: str, rule: str, mirrors: str, replaces: tuple[object, str], quirk: str = "",
           checked_by: str = "streams", applies=None):
    """Register the decorated function as the replacement of ``replaces``.

    ``quirk`` names the ``reference.quirks`` entry the mutant takes away;
    ``checked_by`` and ``applies`` are those of ``Mutant``."""
    def register(fn):
        MUTANTS.append(Mutant(name, rule, mirrors, replace(*replaces, fn, name in QUESTIONS),
                              quirk=quirk, checked_by=checked_by, applies=applies))
        return fn
    return register


def register(name: str, rule: str, mirrors: str, replaces: tuple[object, str], new,
             applies=None) -> None:
    """Register a replacement that is not a function (a property, a constant)."""
    MUTANTS.append(Mutant(name, rule, mirrors, replace(*replaces, new, name in QUESTIONS),
                          applies=applies))


# Streams a rule can matter on (Mutant.applies); s is a harness.stream.Stream.

def drafts(s) -> bool:
    return s.config.num_speculative_tokens > 0


def eagle(s) -> bool:
    return drafts(s) and s.config.speculative_method == "eagle"


def caching(s) -> bool:
    return s.config.enable_prefix_caching


def priority(s) -> bool:
    return s.config.policy == "priority"


def fcfs(s) -> bool:
    return s.config.policy == "fcfs"


def chunked_off(s) -> bool:
    return not s.config.enable_chunked_prefill


def threshold(s) -> bool:
    return s.config.long_prefill_token_threshold > 0


def eagle_and_caching(s) -> bool:
    return eagle(s) and caching(s)


def drafts_and_caching(s) -> bool:
    return drafts(s) and caching(s)


def fcfs_chunked_off(s) -> bool:
    return fcfs(s) and chunked_off(s)


def chunked_off_threshold(s) -> bool:
    return chunked_off(s) and threshold(s)


def priority_drafts(s) -> bool:
    return priority(s) and drafts(s)


def _has_group(s, kind: str) -> bool:
    return any(g.type == kind for g in s.config.groups)


def sliding(s) -> bool:
    return _has_group(s, "sliding_window")


def chunked_local(s) -> bool:
    return _has_group(s, "chunked_local")


def mamba_drafts(s) -> bool:
    return _has_group(s, "mamba") and drafts(s)


def several_groups(s) -> bool:
    return len(s.config.groups) > 1


def hybrid_caching(s) -> bool:
    return caching(s) and several_groups(s)


def sliding_caching(s) -> bool:
    return sliding(s) and caching(s)


def sliding_drafts_caching(s) -> bool:
    return sliding_caching(s) and drafts(s)


def chunked_local_caching(s) -> bool:
    return chunked_local(s) and caching(s)


def from_memory(s) -> bool:
    return s.config.kv_cache_memory_bytes is not None


def priority_windows(s) -> bool:
    return priority(s) and (sliding(s) or chunked_local(s))


def lora(s) -> bool:
    return s.config.max_loras is not None and any(r.lora is not None for r in s.requests)


def lora_and_caching(s) -> bool:
    return lora(s) and caching(s)


def encoder(s) -> bool:
    return s.config.has_encoder and any(r.mm_inputs for r in s.requests)


def encoder_and_caching(s) -> bool:
    return encoder(s) and caching(s)


def encoder_eagle(s) -> bool:
    return encoder(s) and eagle(s)


def chunked_mm_off(s) -> bool:
    return encoder(s) and s.config.disable_chunked_mm_input


def stats(s) -> bool:
    return s.config.log_stats


def stats_caching(s) -> bool:
    return stats(s) and caching(s)


def stats_drafts(s) -> bool:
    return stats(s) and drafts(s)


def kv_events(s) -> bool:
    return s.config.kv_cache_events and caching(s)


def kv_events_lora(s) -> bool:
    return kv_events(s) and lora(s)


def kv_events_resets(s) -> bool:
    # A reset is announced with prefix caching off too.
    return s.config.kv_cache_events and bool(s.reset_prefix_cache_steps)


def connector(s) -> bool:
    return s.config.kv_role is not None


def _transfers(s):
    return [r.kv_transfer for r in s.requests if r.kv_transfer is not None]


def connector_loads(s) -> bool:
    return connector(s) and any(t.external_tokens > 0 for t in _transfers(s))


def connector_async(s) -> bool:
    return connector(s) and any(t.external_tokens > 0 and t.load_async for t in _transfers(s))


def connector_async_caching(s) -> bool:
    return connector_async(s) and caching(s)


def connector_unknown(s) -> bool:
    return connector(s) and any(t.unknown_lookups > 0 for t in _transfers(s))


def connector_sends(s) -> bool:
    return connector(s) and any(t.send_steps is not None for t in _transfers(s))


def grammar(s) -> bool:
    return any(r.structured_output is not None for r in s.requests)


def grammar_drafts(s) -> bool:
    return grammar(s) and drafts(s)


def pooling(s) -> bool:
    return any(r.pooling for r in s.requests)



# -- the block pool and the KV cache manager --------------------------------------------

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


# -- hybrid models: the per-type managers and the coordinator ------------------------------

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


# -- the scheduler: running requests and preemption ---------------------------------------

@mutant("fcfs_preempt_first_running", "fcfs preempts the last running request", SCHEDULER,
        replaces=(rsched.Scheduler, "fcfs_victim"), applies=fcfs)
def _first_running(self):
    return self.running[0]


@mutant("priority_victim_by_arrival_only", "priority victim is the max (priority, arrival)",
        SCHEDULER, replaces=(rsched.Scheduler, "priority_victim"), applies=priority)
def _newest_running(self):
    return max(self.running, key=lambda r: r.arrival_time)


@mutant("waiting_admitted_after_preemption",
        "no waiting request is admitted in a step that preempted", SCHEDULER,
        replaces=(rsched.Scheduler, "admits_waiting"))
def _always_admits(self, plan):
    return True


@mutant("priority_quirk_fixed", "0.11.0 keeps a preempted victim's grant (fixed by PR #26661)",
        SCHEDULER, replaces=(rconfig.Config, "has"), quirk="PRIORITY_VICTIM_KEEPS_ITS_GRANT",
        applies=priority)
def _with_0_11_1_victim_rule(self, rule_change):
    """vLLM 0.11.1's priority_victim_loses_its_grant, applied to 0.11.0."""
    return rule_change == "priority_victim_loses_its_grant" or rule_change in self.rules


# Tie-breaks: identity and order are different things.

@mutant("fcfs_victim_newest_arrival", "fcfs preempts the request that joined the running list last",
        SCHEDULER, replaces=(rsched.Scheduler, "fcfs_victim"), applies=fcfs)
def _newest_arrival(self):
    return max(self.running, key=lambda r: r.arrival_time)


@mutant("fcfs_victim_by_id", "fcfs preempts by running order, never by request id", SCHEDULER,
        replaces=(rsched.Scheduler, "fcfs_victim"), applies=fcfs)
def _largest_id(self):
    return max(self.running, key=lambda r: r.request_id)


@mutant("priority_victim_by_id", "priority ties are broken by arrival_time, not by request id",
        SCHEDULER, replaces=(rsched.Scheduler, "priority_victim"), applies=priority)
def _priority_then_id(self):
    return max(self.running, key=lambda r: (r.priority, r.request_id))


@mutant("priority_queue_by_id", "the priority queue orders by (priority, arrival_time)",
        REQUEST_QUEUE, replaces=(rq.PriorityQueue, "add"), applies=priority)
def _queue_by_priority_then_id(self, request):
    heapq.heappush(self._heap, (request.priority, request.request_id, id(request), request))


_update_from_output = rsched.Scheduler.update_from_output


@mutant("outputs_in_id_order", "outputs are taken in the step's scheduling order", SCHEDULER,
        replaces=(rsched.Scheduler, "update_from_output"))
def _outputs_sorted_by_id(self, output, sampled, *args, **kwargs):
    by_id = dict(sorted(output.num_scheduled_tokens.items()))
    return _update_from_output(self, dataclasses.replace(output, num_scheduled_tokens=by_id),
                               sampled, *args, **kwargs)


@mutant("model_len_cap_off_by_one", "tokens are capped at max_model_len - 1 - computed",
        SCHEDULER, replaces=(rsched.Scheduler, "cap_model_len"))
def _cap_at_max_model_len(self, request, num_tokens):
    return min(num_tokens, self.config.max_model_len - request.num_computed_tokens)


_preempt = rsched.Scheduler._preempt


@mutant("preempted_keep_progress", "a preempted request's num_computed_tokens drops to 0",
        SCHEDULER, replaces=(rsched.Scheduler, "_preempt"))
def _preempt_keeping_progress(self, victim, plan):
    computed = victim.num_computed_tokens
    _preempt(self, victim, plan)
    victim.num_computed_tokens = min(computed, victim.num_tokens - 1)


# -- the scheduler: waiting requests ------------------------------------------------------

@mutant("threshold_ignored_when_waiting", "the long-prefill threshold caps waiting requests too",
        SCHEDULER, replaces=(rsched.Scheduler, "waiting_tokens"), applies=threshold)
def _uncapped_waiting(self, request, num_computed, padding=0):
    return request.num_tokens - num_computed + padding


@mutant("max_num_seqs_off_by_one", "at most max_num_seqs requests run", SCHEDULER,
        replaces=(rsched.Scheduler, "has_free_seat"))
def _one_seat_too_many(self):
    return len(self.running) <= self.config.max_num_seqs


@mutant("skipped_waiting_to_tail", "with chunked prefill off, skipped requests go back to the head",
        REQUEST_QUEUE, replaces=(rq.FcfsQueue, "prepend_all"), applies=None)
def _to_the_tail(self, other, reverse=False):
    for request in other:
        self.add(request)


@mutant("set_aside_order_kept", "requests set aside in one step come back reversed (fcfs)",
        SCHEDULER, replaces=(rsched.Scheduler, "set_aside"),
        quirk="SKIPPED_WAITING_REQUESTS_REVERSED", applies=None)
def _set_aside_in_order(self, set_aside, request):
    set_aside.add(request)


_waiting_tokens = rsched.Scheduler.waiting_tokens


@mutant("set_aside_before_threshold",
        "with chunked prefill off, the whole-prompt test sees the threshold-capped count",
        SCHEDULER, replaces=(rsched.Scheduler, "waiting_grant"), applies=chunked_off_threshold)
def _whole_prompt_test_first(self, request, num_computed, plan, padding=0):
    uncapped = request.num_tokens - num_computed + padding
    if self.sets_aside(uncapped, plan):
        return None
    return min(_waiting_tokens(self, request, num_computed, padding), plan.token_budget)


register("resumed_prompt_only", "a resumed request recomputes prompt and outputs", REQUEST,
         (rreq.Request, "num_tokens"),
         property(lambda r: len(r.all_token_ids) if r.status != RequestStatus.PREEMPTED
                  else len(r.prompt_token_ids)))


# -- speculative decoding -------------------------------------------------------------------

register("eagle_no_lookahead", "eagle reserves num_speculative_tokens lookahead slots", SCHEDULER,
         (rsched.Config, "num_lookahead_tokens"), property(lambda c: 0), applies=eagle)

_num_scheduled_drafts = rsched.Scheduler.num_scheduled_drafts


@mutant("drafts_not_trimmed", "scheduled drafts are trimmed to the granted tokens", SCHEDULER,
        replaces=(rsched.Scheduler, "num_scheduled_drafts"), applies=drafts)
def _every_draft(self, request, num_new):
    return len(request.spec_token_ids) if _num_scheduled_drafts(self, request, num_new) > 0 else 0


@mutant("rejected_drafts_not_subtracted",
        "rejected drafts are taken back from num_computed_tokens", SCHEDULER,
        replaces=(rsched.Scheduler, "num_rejected"), applies=drafts)
def _none_rejected(self, drafts, tokens):
    return 0


_take_back_rejected = rsched.Scheduler._take_back_rejected


@mutant("rejected_drafts_kept_by_victim",
        "rejected drafts are subtracted even from a request preempted in the same step",
        SCHEDULER, replaces=(rsched.Scheduler, "_take_back_rejected"),
        quirk="REJECTED_DRAFTS_ALWAYS_SUBTRACTED", applies=priority_drafts)
def _only_while_running(self, request, drafts, tokens):
    if request.status == RequestStatus.RUNNING:
        _take_back_rejected(self, request, drafts, tokens)


# -- stops and the output -------------------------------------------------------------------

@mutant("tokens_after_stop_kept", "tokens after a stop are dropped", SCHEDULER,
        replaces=(rsched.Scheduler, "_append_outputs"))
def _append_past_stop(self, request, tokens):
    stopped = False
    for token in tokens:
        request.append_output_token(token)
        stopped = rsched.check_stop(request, self.config.max_model_len,
                                    self.config.has("stop_tokens_before_length")) or stopped
    return tokens, stopped


@mutant("eos_ignored", "EOS stops a request unless ignore_eos", SCHED_UTILS,
        replaces=(rreq, "stopped_by_eos"))
def _never_eos(request):
    return False


@mutant("finished_reported_again", "finished ids are reported once, on the next step", SCHEDULER,
        replaces=(rsched.Scheduler, "_forget_reported_finished"))
def _remember_finished(self):
    self.finished_req_ids = set(self.finished_req_ids)


@mutant("slot_offset_ignored", "a token's slot is page * block_size + its offset in the page",
        WORKER_BLOCK_TABLE, replaces=(rslots.WorkerBlockTable, "slot_of"))
def _page_start(self, table, position):
    return table[position // self.block_size] * self.block_size


# -- KV sizing: the model shape read from config.json ----------------------------------------
# No stream shows these (the scheduler counts pages, not bytes): they are killed by the KV
# sizing check, harness.kv_sizing_check.differences() (make conformance, and
# tests/test_kv_sizing_conformance.py), over the bundled model configs.


@mutant("kv_heads_from_attention_heads",
        "KV heads are num_key_value_heads (one per attention head when absent)", MODEL_CONFIG,
        replaces=(rkvs, "config_kv_heads"), checked_by="kv sizing")
def _attention_heads(cfg):
    return cfg["num_attention_heads"]


@mutant("head_size_from_kv_heads",
        "head size is head_dim, else hidden_size / num_attention_heads", MODEL_CONFIG,
        replaces=(rkvs, "config_head_size"), checked_by="kv sizing")
def _hidden_over_kv_heads(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // rkvs.config_kv_heads(cfg)


@mutant("head_dim_key_ignored", "a config's head_dim wins over hidden_size / num_attention_heads",
        MODEL_CONFIG, replaces=(rkvs, "config_head_size"), checked_by="kv sizing")
def _hidden_over_heads(cfg):
    return cfg["hidden_size"] // cfg["num_attention_heads"]


@mutant("dtype_key_ignored", "the model dtype is the config's torch_dtype (newer configs: dtype)",
        MODEL_CONFIG, replaces=(rkvs, "config_dtype"), checked_by="kv sizing")
def _newer_key_only(cfg):
    return cfg.get("dtype") or "bfloat16"


# -- KV sizing of a stream's pool ---------------------------------------------------------------
# Each engine cuts the pool of a stream given as kv_cache_memory_bytes at its own start-up
# (harness.engines.reference_engine.ReferenceEngine.sized; the vLLM engines with vLLM's
# sizing), so a rule of the cut shows as a divergence in every such stream.


@mutant("pool_pages_rounded_up", "the pool is the whole pages the memory holds, rounded down",
        KV_CACHE_UTILS, replaces=(rkvs, "num_blocks_for_budget"), applies=from_memory)
def _partial_page_counted(shape, block_size, available_memory, num_gpu_blocks_override=None):
    whole_pool_page = shape.page_size_bytes(block_size) * shape.num_layers
    blocks = max(-(-available_memory // whole_pool_page), 0)
    return rkvs.override_num_blocks(blocks, num_gpu_blocks_override)


# -- KV sizing of hybrid models (reference/kv_sizing_hybrid.py) ------------------------------
# Killed by the same check, on the bundled hybrid configs (Gemma 3, Llama 4, Granite 4.0-H).


@mutant("sliding_window_no_extra_page",
        "a sliding-window layer needs the pages of window - 1 + max_num_batched_tokens tokens "
        "(at most max_model_len) plus one", KV_CACHE_INTERFACE,
        replaces=(rkvh, "attention_pages_needed"), checked_by="kv sizing")
def _window_pages_only(spec, max_model_len, max_num_batched_tokens):
    if spec.kind == rkvh.SLIDING_WINDOW:
        tokens = min(spec.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return rkvs.cdiv(tokens, spec.block_size)
    return _attention_pages_needed(spec, max_model_len, max_num_batched_tokens)


_attention_pages_needed = rkvh.attention_pages_needed


@mutant("padding_groups_contiguous",
        "a kind's layers are dealt round robin into its groups (layers[i::groups])",
        KV_CACHE_UTILS, replaces=(rkvh, "split_kind"), checked_by="kv sizing")
def _contiguous_groups(layers, group_size):
    return [layers[i:i + group_size] for i in range(0, len(layers), group_size)]


@mutant("mamba_block_not_multiple_of_16",
        "a Mamba hybrid's attention block is the smallest multiple of 16 tokens whose page "
        "holds a Mamba state", HYBRID_MODEL_CONFIG,
        replaces=(rkvh, "mamba_attention_block_size"), checked_by="kv sizing")
def _smallest_block(block_size, attn_bytes_per_token, mamba_page):
    needed = rkvs.cdiv(mamba_page, attn_bytes_per_token)
    return needed if block_size is None or block_size < needed else block_size


@mutant("chunked_local_keeps_hybrid_manager",
        "chunked local attention turns the hybrid KV cache manager off unless "
        "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1", VLLM_CONFIG,
        replaces=(rkvh, "hybrid_manager_on"), checked_by="kv sizing")
def _manager_kept(cfg, disable_hybrid_kv_cache_manager=False,
                  allow_chunked_local_with_hybrid=False):
    return not disable_hybrid_kv_cache_manager


_add_row = rslots.WorkerBlockTable.add_row


def _fresh_row(self, block_ids, row):
    self.rows[row] = [0] * self.width
    _add_row(self, block_ids, row)


# -- equivalent: no stream can tell them from the original -----------------------------------

MUTANTS += [
    Mutant("worker_rows_cleared", "a rewritten worker row keeps its older entries",
           WORKER_BLOCK_TABLE, replace(rslots.WorkerBlockTable, "add_row", _fresh_row),
           quirk="STALE_WORKER_ROWS",
           equivalent="the harness's worker keeps one row per request and rewrites it only "
                      "when the request is new or resumed, with its whole table; every position "
                      "looked up after that lies inside the pages the scheduler allocated, so an "
                      "older entry past the new length is never read (no stream of 10,000 "
                      "generated, priority victims included, shows it)"),
    Mutant("break_on_zero_tokens", "a running request with 0 tokens is skipped (continue)",
           SCHEDULER, None,
           equivalent="with synchronous scheduling a running request always has >= 1 token to "
                      "compute (it holds num_tokens - 1 computed, and num_tokens < max_model_len); "
                      "0 needs async scheduling, pipeline parallelism or encoder budgets"),
    Mutant("threshold_after_budget", "long-prefill threshold applies before the budget",
           SCHEDULER, None,
           equivalent="a positive threshold caps like min(n, threshold), and min commutes with "
                      "the budget's min: both orders give the same count"),
]


# -- LoRA adapters and structured output -------------------------------------------------

@mutant("lora_slots_ignored", "a waiting request whose adapter finds no free slot is set aside",
        SCHEDULER, replaces=(rlora.AdapterSlots, "turns_away"), applies=lora)
def _never_turned_away(self, request):
    return False


_adapter_slots_init = rlora.AdapterSlots.__init__


@mutant("lora_slots_without_running", "the running requests' adapters fill the step's slots first",
        SCHEDULER, replaces=(rlora.AdapterSlots, "__init__"), applies=lora)
def _slots_start_empty(self, max_loras, scheduled_running):
    _adapter_slots_init(self, max_loras, ())


@mutant("pooled_request_runs_on", "a pooling request finishes once the model hands back its "
        "pooled output", SCHEDULER, replaces=(rsched, "check_pooled"), applies=pooling)
def _never_pooled(request):
    return False


@mutant("lora_overfill_not_asserted", "a step whose running requests hold more adapters than "
        "max_loras fails vLLM's assertion", SCHEDULER,
        replaces=(rlora.AdapterSlots, "check_not_overfilled"),
        quirk="LORA_SLOTS_OVERFILLED_AFTER_A_SKIP", applies=lora)
def _overfill_allowed(self):
    return None


@mutant("lora_same_adapter_turned_away", "a request whose adapter is already in the step joins it",
        SCHEDULER, replaces=(rlora.AdapterSlots, "turns_away"), applies=lora)
def _full_slots_turn_everyone_away(self, request):
    return (self.max_loras is not None and request.lora_id is not None
            and len(self.ids) == self.max_loras)


@mutant("grammar_wait_ignored", "a request waits in WAITING_FOR_FSM until its grammar is ready",
        SCHEDULER, replaces=(rsched.Scheduler, "waits_for_grammar"), applies=grammar)
def _grammar_never_awaited(self, request):
    if request.status == RequestStatus.WAITING_FOR_FSM:
        request.status = RequestStatus.WAITING
    return False


_schedule = rsched.Scheduler.schedule


@mutant("grammar_status_at_readiness", "WAITING_FOR_FSM ends when the scheduler reaches the "
        "request with its grammar ready, not when the grammar compiles", SCHEDULER,
        replaces=(rsched.Scheduler, "schedule"), applies=grammar)
def _status_flips_on_compile(self):
    for request in self.requests.values():
        if request.status == RequestStatus.WAITING_FOR_FSM and request.grammar.ready:
            request.status = RequestStatus.WAITING
    return _schedule(self)


@mutant("drafts_not_validated", "drafts are cut before the first token the grammar rejects",
        SCHEDULER, replaces=(rso.Grammar, "validate"), applies=grammar_drafts)
def _every_draft_valid(self, tokens):
    return list(tokens)


@mutant("grammar_batch_running_first", "the worker's batch lists new, then running, then "
        "resumed requests", SCHEDULER, replaces=(rsched.Scheduler, "worker_batch"), applies=grammar)
def _running_first(self, plan):
    return plan.running + plan.new + plan.resumed


@mutant("bitmask_rows_not_rolled_back", "the grammar steps back after filling a request's rows",
        STRUCTURED_OUTPUT, replaces=(rso.Grammar, "rollback"), applies=grammar_drafts)
def _no_rollback(self, num_tokens):
    return None


@mutant("grammar_not_advanced", "the tokens a constrained request emits advance its grammar",
        SCHEDULER, replaces=(rso.Grammar, "accept"), applies=grammar)
def _outputs_not_accepted(self, tokens):
    return None


# -- multimodal inputs --------------------------------------------------------------------

@mutant("mm_hash_not_in_block_hash", "the content hashes of the items a block touches are "
        "extra keys of the block", KV_CACHE_UTILS, replaces=(rhash, "mm_keys"),
        applies=encoder_and_caching)
def _no_mm_keys(items, start, end, item, with_offset=False):
    return (), item


@mutant("mm_item_ending_at_block_start_skipped", "an item ending exactly where a block starts "
        "counts as touching it", KV_CACHE_UTILS, replaces=(rhash, "ended_before"),
        quirk="MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING", applies=encoder_and_caching)
def _ended_at_or_before(item, start, with_offset=False):
    return start >= item.offset + item.length


@mutant("mm_later_hashing_from_first_item", "a later hashing looks only at the last item",
        KV_CACHE_UTILS, replaces=(rhash, "first_item_to_look_at"), applies=encoder_and_caching)
def _always_from_the_first_item(items, start, every_item=False, with_offset=False):
    return 0


_try_encode = rencin.try_schedule_encoder_inputs


@mutant("encoder_budget_ignored", "the encoder runs at most encoder_compute_budget tokens a step",
        SCHEDULER, replaces=(rsched, "try_schedule_encoder_inputs"), applies=encoder)
def _unbounded_encoder(request, num_computed, num_new, budget, cache, **kw):
    encode, num_new, _ = _try_encode(request, num_computed, num_new, 1 << 30, cache, **kw)
    return encode, num_new, budget


@mutant("encoder_budget_not_raised_to_largest_item", "the encoder budget and cache are raised "
        "to the model's largest item", "vllm/v1/core/encoder_cache_manager.py",
        replaces=(rsched, "encoder_budgets"), applies=encoder)
def _configured_sizes(max_tokens_by_modality, *, max_num_encoder_input_tokens,
                      encoder_cache_size, **kw):
    if not max_tokens_by_modality:
        return 0, 0
    return max_num_encoder_input_tokens, encoder_cache_size


@mutant("encoder_outputs_not_shared", "an item whose content is in the encoder cache is not "
        "encoded again", "vllm/v1/core/encoder_cache_manager.py",
        replaces=(renc.EncoderCacheManager, "check_and_update_cache"), applies=encoder)
def _never_cached(self, request, input_id):
    return False


@mutant("encoder_evicts_newest", "the encoder cache evicts the entry freeable longest first",
        "vllm/v1/core/encoder_cache_manager.py",
        replaces=(renc.EncoderCacheManager, "evict_until"), applies=encoder)
def _evict_newest(self, needed):
    while self.num_free_slots < needed:
        mm_hash = next(reversed(self.freeable))
        self.num_free_slots += self.freeable.pop(mm_hash)
        del self.holders[mm_hash]
        self.freed.append(mm_hash)


@mutant("encoder_outputs_held_to_the_end", "a request lets go of an encoder output once its "
        "placeholder is computed", SCHEDULER, replaces=(rsched, "free_encoder_inputs"),
        applies=encoder)
def _held_until_finished(request, num_computed, cache, **kw):
    return None


@mutant("chunked_mm_input_allowed", "with disable_chunked_mm_input a placeholder is computed "
        "in one step", SCHEDULER, replaces=(rencin, "cut_to_whole_item"), applies=chunked_mm_off)
def _never_cut_to_whole(item, num_computed, range_end, from_its_start=False, from_inside=False):
    return False


@mutant("preempted_keeps_encoder_outputs", "a preempted request lets go of its encoder outputs",
        SCHEDULER, replaces=(rsched.Scheduler, "_preempt"), applies=encoder)
def _preempt_keeping_encoder(self, victim, plan):
    self.kv.free(victim)
    victim.status = RequestStatus.PREEMPTED
    victim.num_computed_tokens = 0
    self.waiting.prepend(victim)
    plan.preempted.append(victim)
    self.emit(rsched.events.Preempted(victim.request_id))


# -- scheduler stats ----------------------------------------------------------------------

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


# -- KV cache events ---------------------------------------------------------------------

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


# -- a KV connector ----------------------------------------------------------------------

KV_CONNECTOR_BASE = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"


@mutant("remote_kv_not_awaited", "a request loading asynchronously waits until the worker "
        "reports the load done", SCHEDULER, replaces=(rsched.Scheduler, "waits_for_remote_kv"),
        applies=connector_async)
def _load_taken_as_done(self, request):
    if request.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
        return False
    self.finished_recving.add(request.request_id)
    self._take_loaded_tokens(request)
    request.status = RequestStatus.WAITING
    return False


@mutant("loaded_last_token_not_recomputed", "after a load that covers every token, the last "
        "one is computed again", SCHEDULER, replaces=(rsched, "tokens_after_load"),
        applies=connector_async)
def _every_loaded_token_kept(num_pages, block_size, num_tokens):
    return min(num_pages * block_size, num_tokens)


@mutant("connector_asked_after_load", "only a request with nothing computed asks the "
        "connector", SCHEDULER, replaces=(rsched.Scheduler, "external_hit"),
        applies=connector)  # a loaded request, or 0.11.0's priority victim
def _asked_again(self, request, num_hit):
    if self.connector is None:
        return 0, False
    num_external, load_async = self.connector.get_num_new_matched_tokens(request, num_hit)
    if num_external is None:
        return None
    if request.num_computed_tokens > 0:
        return num_external, False
    return num_external, load_async


@mutant("unknown_answer_taken_as_zero", "a connector that cannot tell yet sets the request "
        "aside for the step", SCHEDULER, replaces=(rsched.Scheduler, "external_hit"),
        applies=connector_unknown)
def _unknown_as_nothing(self, request, num_hit):
    answer = _external_hit(self, request, num_hit)
    return (0, False) if answer is None else answer


_external_hit = rsched.Scheduler.external_hit


@mutant("kept_pages_freed_at_once", "a finished request's pages stay held while the "
        "connector sends them", SCHEDULER, replaces=(rsched.Scheduler, "_free_request"),
        applies=connector_sends)
def _free_despite_sending(self, request, keep_pages=False):
    self.connector_keeps_pages(request)
    self.encoder_cache.free(request)
    self.finished_req_ids.add(request.request_id)
    self._free_pages(request)


@mutant("send_report_ignored", "pages kept for sending are freed when the worker reports "
        "the send done", SCHEDULER, replaces=(rsched.Scheduler, "take_transfers"),
        applies=connector_sends)
def _sends_never_done(self, finished_recving, finished_sending):
    self.finished_recving.update(finished_recving)


@mutant("connector_told_new_pages_only", "the connector is told the request's hit pages "
        "and its new pages, hits first", SCHEDULER,
        replaces=(rsched.Scheduler, "tell_connector_pages"), applies=connector)
def _new_pages_only(self, request, hit, new_blocks, num_external):
    if self.connector is not None:
        self.connector.update_state_after_alloc(
            request, [b.block_id for b in new_blocks[0]], num_external)


@mutant("async_load_cached_at_once", "pages a load fills are cached when the load is done, "
        "not when they are given", KV_CACHE_MANAGER,
        replaces=(rkv.KVCacheManager, "allocate_slots"), applies=connector_async_caching)
def _cache_before_load(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0, delay_caching=False,
                       num_external_tokens=0, **more):
    return _allocate_slots(self, request, num_new_tokens, num_new_computed_tokens,
                           new_computed_blocks, num_lookahead_tokens,
                           num_external_tokens=num_external_tokens, **more)


_allocate_slots = rkv.KVCacheManager.allocate_slots


# -- the engine loop (vllm/v1/engine/core.py) ----------------------------------------------
ENGINE_CORE = "vllm/v1/engine/core.py"


@mutant("engine_steps_while_idle", "EngineCore does not step without requests: an idle "
        "step publishes no KV events and reports no stats", ENGINE_CORE,
        replaces=(rsched.Scheduler, "has_requests"))
def _always_busy(self):
    return True


@mutant("finished_told_only_with_work", "a step runs to tell the worker of finished "
        "requests, with nothing else to do", ENGINE_CORE,
        replaces=(rsched.Scheduler, "has_requests"))
def _unfinished_only(self):
    return self.num_unfinished() > 0


@mutant("flash_layout_for_any_block_size", "the flash-attention backend refuses a block "
        "size that is not a multiple of 16 (no tensor layout in the trace header)",
        "vllm/v1/attention/backends/flash_attn.py",
        replaces=(rkvs, "flash_attention_shape"),
        applies=lambda s: s.config.kv_cache_memory_bytes is not None)
def _flash_layout_always(num_blocks, block_size, num_kv_heads, head_size, pages_first=False,
                         kv_in_last_dim=False):
    return rkvs.kv_cache_tensor_shape(num_blocks, block_size, num_kv_heads, head_size)


# -- async scheduling (reference/async_scheduler.py, reference/engine_core.py) -------------

ASYNC_SCHEDULER = "vllm/v1/core/sched/async_scheduler.py"


def async_scheduling(s) -> bool:
    return s.config.async_scheduling


def pipeline_parallel(s) -> bool:
    return s.config.pipeline_parallel_size > 1


def batch_queue(s) -> bool:
    return s.config.batch_queue


@mutant("batch_applied_at_once", "with a batch queue a step does not wait for the "
        "batch it just scheduled while the queue has room and the worker is busy",
        ENGINE_CORE, replaces=(rengine, "applies_oldest_now"), applies=batch_queue)
def _always_waits(in_flight, queue_size, runs_work, worker_done):
    return True


@mutant("worker_done_not_looked_at", "a batch the worker has already finished is applied "
        "in the step that scheduled it", ENGINE_CORE,
        replaces=(rengine, "applies_oldest_now"), applies=batch_queue)
def _never_done(in_flight, queue_size, runs_work, worker_done):
    return not (runs_work and in_flight < queue_size)


@mutant("empty_batch_does_not_wait", "a step whose batch runs no work waits for the oldest "
        "batch in flight", ENGINE_CORE, replaces=(rengine, "applies_oldest_now"),
        applies=batch_queue)
def _empty_returns_early(in_flight, queue_size, runs_work, worker_done):
    return in_flight >= queue_size or worker_done


@mutant("pipeline_stages_ignored", "under pipeline parallelism EngineCore keeps as many "
        "batches in flight as there are stages", ENGINE_CORE,
        replaces=(rengine, "batch_queue_size"), applies=pipeline_parallel)
def _queue_of_two(async_scheduling, pipeline_parallel_size=1):
    return 2 if async_scheduling or pipeline_parallel_size > 1 else 1


@mutant("placeholders_not_scheduled", "a running request's output placeholders count as "
        "tokens to compute", SCHEDULER, replaces=(rsched.Scheduler, "running_tokens"),
        applies=async_scheduling)
def _without_placeholders(self, request, budget):
    num_new = self.cap_long_prefill(request.num_tokens_with_spec - request.num_computed_tokens)
    return self.cap_model_len(request, min(num_new, budget))


@mutant("sampling_ignores_placeholders", "a grant samples (takes a placeholder) when it "
        "reaches every known token and every placeholder", ASYNC_SCHEDULER,
        replaces=(rasync, "samples_now"), applies=async_scheduling)
def _samples_at_known_tokens(request):
    return request.num_computed_tokens == request.num_tokens


@mutant("async_outputs_not_cached", "under async scheduling the pages a batch's tokens fill "
        "are cached when its output is applied", ASYNC_SCHEDULER,
        replaces=(rasync.AsyncScheduler, "_append_outputs"), applies=async_scheduling)
def _append_without_caching(self, request, tokens):
    kept, stopped = rsched.Scheduler._append_outputs(self, request, tokens)
    request.num_output_placeholders -= len(kept)
    return kept, stopped


@mutant("placeholders_kept_after_output", "a token applied takes its placeholder's place",
        ASYNC_SCHEDULER, replaces=(rasync.AsyncScheduler, "_append_outputs"),
        applies=async_scheduling)
def _append_keeping_placeholders(self, request, tokens):
    was_running = request.status == RequestStatus.RUNNING
    kept, stopped = rsched.Scheduler._append_outputs(self, request, tokens)
    if was_running:
        self.kv.cache_blocks(request, request.num_computed_tokens
                             - request.num_output_placeholders)
    return kept, stopped


# -- the rule changes of later releases (reference/releases.py) ---------------------------
# Each mutant takes one rule change out of every release that has it.  The suite kills it
# by replaying that release's recorded traces (side "release <version>": no vLLM needed).

_has = rconfig.Config.has
_CHANGE_MODULES = {
    "priority_victim_loses_its_grant": SCHEDULER,
    "stop_tokens_before_length": SCHED_UTILS,
    "running_tokens_capped_by_max_tokens": SCHEDULER,
    "threshold_dropped_when_nothing_chunks": "vllm/config/vllm.py",
    "chunked_off_stops_at_first_misfit": SCHEDULER,
    "chunked_local_frees_last_cached_page": SINGLE_TYPE,
    "grammar_rows_in_grant_order": SCHEDULER,
    "prefix_stats_split_preempted": KV_CACHE_MANAGER,
    "kv_events_name_the_adapter": BLOCK_POOL,
    "eagle_encoder_one_token_ahead": SCHEDULER,
    "eagle_lookahead_item_waits": SCHEDULER,
    "abort_skips_finished_requests": SCHEDULER,
    "kv_events_published_after_update": SCHEDULER,
    "async_skips_requests_at_max_tokens": SCHEDULER,
    "admission_reserves_whole_sequence": SCHEDULER,
    "set_aside_requests_wait_apart": SCHEDULER,
    "connector_told_whole_table": SCHEDULER,
    "null_pages_never_cached": BLOCK_POOL,
    "window_hits_skipped_at_admission": SINGLE_TYPE,
    "window_pages_freed_before_connector_finish": SCHEDULER,
    "waiting_stats_count_set_aside_apart": SCHEDULER,
    "connector_finish_window_of_computed_tokens": SCHEDULER,
    "admission_reserves_lookahead": SCHEDULER,
    "uncached_pages_reused_first": SINGLE_TYPE,
    "window_of_one_indexes_nothing": SINGLE_TYPE,
    "kv_pages_first_in_tensor": "vllm/v1/attention/backends/flash_attn.py",
    "every_uncached_page_reused_first": BLOCK_POOL,
    "set_aside_order_kept": "vllm/v1/core/sched/request_queue.py",
    "grammar_rows_skip_prefill_chunks": SCHEDULER,
    "async_load_counts_tokens_at_once": SCHEDULER,
    "mm_hash_keys_carry_the_offset": KV_CACHE_UTILS,
    "loaded_preempted_request_resumes": SCHEDULER,
    "failed_admission_lets_go_of_encoder_inputs": SCHEDULER,
    "hybrid_hit_searched_until_groups_agree": KV_CACHE_COORDINATOR,
    "hybrid_eagle_drop_once_per_group": KV_CACHE_COORDINATOR,
    "aborted_load_keeps_pages_until_done": SCHEDULER,
    "eagle_whole_item_cut_one_token_earlier": SCHEDULER,
    "kv_packed_in_last_dim": "vllm/v1/attention/backends/flash_attn.py",
    "prefix_stats_counted_at_admission": SCHEDULER,
    "no_caching_frees_to_the_tail": BLOCK_POOL,
    "async_load_leaves_room_for_prefills": SCHEDULER,
    "connector_finish_sees_computed_pages": SCHEDULER,
    "window_admission_capped": SINGLE_TYPE,
    "window_cap_on_every_allocation": SINGLE_TYPE,
    "passed_over_victim_keeps_the_pass": SCHEDULER,
    "lone_group_must_divide_block_size": KV_CACHE_COORDINATOR,
    "recached_outputs_not_freed": "vllm/v1/core/encoder_cache_manager.py",
    "items_taken_per_request": "vllm/v1/core/encoder_cache_manager.py",
    "encoder_frees_wait_for_outputs": SCHEDULER,
    "placeholder_tokens_hold_encoder_outputs": SCHEDULER,
    "batch_queue_fills_before_applying": ENGINE_CORE,
    "held_to_last_occurrence": "vllm/v1/core/encoder_cache_manager.py",
    "window_frees_wait_for_outputs": KV_CACHE_MANAGER,
    "window_cap_counts_batches_in_flight": "vllm/config/vllm.py",
    "new_decode_padded_with_drafts": SCHEDULER,
    "decode_padding_leaves_room_to_sample": SCHEDULER,
    "padding_without_running_requests": SCHEDULER,
    "threshold_lifted_for_a_lone_request": SCHEDULER,
    "external_hit_ignored_without_prefix_reads": SCHEDULER,
    "later_hashing_sees_every_item": KV_CACHE_UTILS,
    "page_holders_wait_first": SCHEDULER,
    "lora_slots_held_by_every_running_request": SCHEDULER,
    "priority_self_preemption_goes_on": SCHEDULER,
    "encoder_cut_sets_aside": SCHEDULER,
    "outputs_update_the_cache_at_once": SCHEDULER,
    "eagle_hashes_cover_the_next_token": KV_CACHE_UTILS,
    "threshold_needs_chunked_prefill": SCHEDULER,
    "unchunked_mm_prompt_not_split": SCHEDULER,
    "range_inside_item_waits_for_the_rest": SCHEDULER,
    "grammar_keeps_first_invalid_draft": "vllm/v1/structured_output/__init__.py",
    "placeholder_leaves_last_row_unfilled": "vllm/v1/structured_output/__init__.py",
    "encoder_outputs_held_for_the_drafter": SCHEDULER,
    "encoder_cuts_at_the_item": SCHEDULER,
    "encoder_length_mismatch_fails_request": SCHEDULER,
    "startup_check_holds_back_null_page": KV_CACHE_UTILS,
    "window_pages_cached_sparsely": SINGLE_TYPE,
    "eagle_window_tails_at_replay_hits": SINGLE_TYPE,
    "eagle_search_reaches_the_last_key": KV_CACHE_COORDINATOR,
    "async_load_reserves_a_draft_step": SCHEDULER,
    "draft_step_counted_in_each_group": SCHEDULER,
    "whole_item_cut_before_lookups": SCHEDULER,
    "threshold_above_max_model_len_refused": "vllm/config/scheduler.py",
    "sending_requests_keep_the_engine_stepping": SCHEDULER,
}


def _without(name: str):
    def has(self, rule_change):
        return rule_change != name and _has(self, rule_change)
    return has


def _kept(name: str):
    def has(self, rule_change):
        return rule_change == name or _has(self, rule_change)
    return has


_CHANGE_APPLIES = {
    "priority_victim_loses_its_grant": priority,
    "threshold_dropped_when_nothing_chunks": lambda s: chunked_off_threshold(s) and not caching(s),
    "chunked_off_stops_at_first_misfit": chunked_off,
    "chunked_local_frees_last_cached_page": chunked_local_caching,
    "grammar_rows_in_grant_order": grammar,
    "prefix_stats_split_preempted": stats,
    "kv_events_name_the_adapter": kv_events_lora,
    "eagle_encoder_one_token_ahead": encoder_eagle,
    "eagle_lookahead_item_waits": encoder_eagle,
    "abort_skips_finished_requests": lambda s: connector_sends(s) and any(
        r.abort_step is not None for r in s.requests),
    # Any batch queue, pipeline stages too (found by test_skipped_runs_could_not_have_changed_
    # the_trace once it drew every property's streams; it said async scheduling only).
    "kv_events_published_after_update": lambda s: batch_queue(s) and s.config.kv_cache_events,
    "async_skips_requests_at_max_tokens": async_scheduling,
    "mm_hash_keys_carry_the_offset": encoder_and_caching,
    "async_load_counts_tokens_at_once": connector_async,
    "loaded_preempted_request_resumes": connector_async,
    "failed_admission_lets_go_of_encoder_inputs": encoder,
    "hybrid_hit_searched_until_groups_agree": lambda s: hybrid_caching(s) and eagle(s),
    "hybrid_eagle_drop_once_per_group": lambda s: hybrid_caching(s) and eagle(s),
    "aborted_load_keeps_pages_until_done": lambda s: connector_async(s) and any(
        r.abort_step is not None for r in s.requests),
    "eagle_whole_item_cut_one_token_earlier": lambda s: chunked_mm_off(s) and s.config.uses_eagle,
    "kv_packed_in_last_dim": lambda s: s.config.kv_cache_memory_bytes is not None,
    "prefix_stats_counted_at_admission": stats_caching,
    "no_caching_frees_to_the_tail": lambda s: not caching(s),
    "async_load_leaves_room_for_prefills": connector_async,
    "connector_finish_sees_computed_pages": connector,
    "window_admission_capped": lambda s: sliding(s) or chunked_local(s),
    "window_cap_on_every_allocation": lambda s: sliding(s) or chunked_local(s),
    "passed_over_victim_keeps_the_pass": priority,
    "lone_group_must_divide_block_size": lambda s: s.config.kv_cache_groups is not None
    and len(s.config.kv_cache_groups) == 1,
    "recached_outputs_not_freed": encoder,
    "items_taken_per_request": encoder,
    "encoder_frees_wait_for_outputs": encoder,
    "placeholder_tokens_hold_encoder_outputs": lambda s: encoder(s) and batch_queue(s),
    "batch_queue_fills_before_applying": batch_queue,
    "held_to_last_occurrence": encoder,
    "window_frees_wait_for_outputs": lambda s: (sliding(s) or chunked_local(s))
    and batch_queue(s),
    "window_cap_counts_batches_in_flight": lambda s: (sliding(s) or chunked_local(s))
    and batch_queue(s),
    "new_decode_padded_with_drafts": drafts,
    "decode_padding_leaves_room_to_sample": drafts,
    "connector_told_whole_table": connector,
    "null_pages_never_cached": lambda s: sliding_caching(s) or chunked_local_caching(s),
    "window_pages_cached_sparsely": sliding_caching,
    "eagle_window_tails_at_replay_hits": lambda s: sliding_caching(s) and eagle(s),
    "eagle_search_reaches_the_last_key": lambda s: hybrid_caching(s) and eagle(s),
    "padding_without_running_requests": drafts,
    "threshold_lifted_for_a_lone_request": threshold,
    "external_hit_ignored_without_prefix_reads": lambda s: connector_loads(s) and any(
        r.prompt_logprobs is not None for r in s.requests),
    "later_hashing_sees_every_item": encoder_and_caching,
    "lora_slots_held_by_every_running_request": lora,
    "priority_self_preemption_goes_on": priority,
    "encoder_cut_sets_aside": encoder,
    "outputs_update_the_cache_at_once": lambda s: drafts(s) or batch_queue(s),
    "eagle_hashes_cover_the_next_token": eagle_and_caching,
    "threshold_needs_chunked_prefill": chunked_off_threshold,
    "unchunked_mm_prompt_not_split": lambda s: encoder(s) and chunked_off(s),
    "range_inside_item_waits_for_the_rest": lambda s: encoder(s) and s.config.disable_chunked_mm_input,
    "grammar_keeps_first_invalid_draft": grammar_drafts,
    "placeholder_leaves_last_row_unfilled": grammar_drafts,
    "encoder_outputs_held_for_the_drafter": lambda s: encoder(s) and s.config.uses_eagle,
    "encoder_cuts_at_the_item": encoder,
    "encoder_length_mismatch_fails_request": encoder,
    "startup_check_holds_back_null_page": lambda s: s.config.kv_cache_memory_bytes is not None,
    "async_load_reserves_a_draft_step": lambda s: connector_async(s) and drafts(s),
    "draft_step_counted_in_each_group": lambda s: connector_async(s) and drafts(s),
    "whole_item_cut_before_lookups": lambda s: encoder(s) and s.config.disable_chunked_mm_input,
    "threshold_above_max_model_len_refused": lambda s:
        s.config.long_prefill_token_threshold > s.config.max_model_len,
    "sending_requests_keep_the_engine_stepping": connector_sends,
}

#: The rule report (harness.reach) runs the reference once per stream for each release its
#: rules are judged on.  The changes up to this release are judged on the ci profile's
#: streams as 0.11.0's rules are; later ones by the replay of their release's recorded
#: traces only (tests/test_releases.py, make mutants), which keeps the report's cost flat
#: as releases are added.  Their reach by the strategies is not measured yet.
STREAM_JUDGED_UNTIL = "0.13.0"

for _change in releases.CHANGES:
    MUTANTS.append(Mutant(
        f"{_change.name}_dropped", f"{_change.since}: {_change.name}",
        _CHANGE_MODULES[_change.name],
        replace(rconfig.Config, "has", _without(_change.name), question=True),
        side=f"release {_change.since}", applies=_CHANGE_APPLIES.get(_change.name),
        checked_by="streams" if releases.order(_change.since)
        <= releases.order(STREAM_JUDGED_UNTIL) else "recorded traces"))
    if _change.until is not None:
        # Kept past the release that undid it: that release's recorded traces must tell.
        MUTANTS.append(Mutant(
            f"{_change.name}_kept", f"{_change.until}: {_change.name} undone",
            _CHANGE_MODULES[_change.name],
            replace(rconfig.Config, "has", _kept(_change.name), question=True),
            side=f"release {_change.until}", applies=_CHANGE_APPLIES.get(_change.name),
            checked_by="recorded traces"))
