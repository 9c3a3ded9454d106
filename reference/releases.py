"""The releases the reference describes, as named rule changes over vLLM 0.11.0.

The reference's modules state vLLM 0.11.0's rules.  Each later release is
0.11.0 plus the rule changes listed here, in the spirit of
ethereum/execution-specs' forks: a change has a name, the release that first
has it (and the release that undid it, if one did), the vLLM pull request
where known, and what changed.  The code that applies a rule asks
``config.has(name)`` at the one place the rule lives, so reading a rule's
function shows both versions of it.  It asks only where the answer can matter
(after the cheap tests of the step's own state): a run that never asks about a
change is the same run with or without it, which the upgrade check uses to
leave such changes untried.

Only behaviour the harness can observe is listed: what a stream decides
(token counts, pages, preemptions, hits, stops, events).  Refactors, renamed
internals and features the streams never turn on (speculative decoding under
async scheduling, which 0.11.0 refuses) are left out; ``harness/engines/vllm_compat.py`` follows
the renamed internals.  One change is left out because no stream can show it:
from 0.11.1 a running request's drafts are cleared once scheduled, but the
proposer hands every scheduled request its next drafts before they are read
again, so the cleared list is never seen.

Also out of reach, and so not listed: Mamba's "align" cache mode (0.15.0 on), which
vLLM turns on only for a Mamba model with prefix caching (the streams refuse prefix
caching with a Mamba group), with its block-aligned prefill chunks and prefill
checkpoint pages (changed in 0.27.0 and 0.29.0 to 0.33.0, ``prefill_end`` included);
a ``prefix_cache_retention_interval`` other than vLLM's default (the streams have
no such field: window_pages_cached_sparsely states the default's rule); and 0.33.0's
window tail one page below the shared prefix for an eagle drafter that still drops a
page, which only a KV connector leaves so (the streams run connectors over one KV cache
group, which never has a shared prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: The releases whose rules the reference states, oldest first.
RELEASES = ("0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0",
            "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1",
            "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0",
            "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0",
            "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")


@dataclass(frozen=True)
class RuleChange:
    """One rule change: where it is in vLLM, where it is in the reference, and which
    streams it can matter on.  Everything the harness knows of a change comes from here."""

    name: str
    since: str  # first release with the new rule
    pr: str  # the vLLM pull request, or "" when not identified
    summary: str  # what the new rule says, against 0.11.0's
    until: str | None = None  # first release that went back to 0.11.0's rule
    mirrors: str = ""  # the vLLM file whose rule changed
    # The reference functions that ask about it (module.Class.function), where it applies.
    applies_in: tuple[str, ...] = ()
    # The streams it can matter on: features of a stream joined by and, or, not (the
    # harness's checks.mutants.applies names them); "" for any stream.
    matters_on: str = ""

    def in_effect(self, release: str) -> bool:
        r = order(release)
        return order(self.since) <= r and (self.until is None or r < order(self.until))


CHANGES: tuple[RuleChange, ...] = (
    RuleChange(
        "priority_victim_loses_its_grant", "0.11.1", "#26661",
        "Under the priority policy, a preemption victim that was already scheduled "
        "earlier in the same step loses what it was granted: its tokens leave the step, "
        "its budget comes back, its new pages and drafts are not handed out, and the "
        "running loop steps back one place so that the request that slid into the "
        "victim's place is not skipped.  (0.11.0 kept the grant: "
        "quirks.PRIORITY_VICTIM_KEEPS_ITS_GRANT.)",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler._pick_victim",),
        matters_on="priority"),
    RuleChange(
        "stop_tokens_before_length", "0.11.1", "#27555",
        "The stop check looks at EOS and the stop tokens before the length caps, so a "
        "request whose last allowed token is EOS or a stop token finishes "
        "FINISHED_STOPPED, not FINISHED_LENGTH_CAPPED.",
        mirrors="vllm/v1/core/sched/utils.py",
        applies_in=("scheduler.Scheduler._append_outputs",)),
    RuleChange(
        "running_tokens_capped_by_max_tokens", "0.11.1", "#27922",
        "A running request computes at most up to prompt + max_tokens - 1 positions "
        "(as well as max_model_len - 1), so drafts that reach past the request's last "
        "output are not scheduled.", until="0.12.0",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.cap_model_len",)),
    RuleChange(
        "threshold_dropped_when_nothing_chunks", "0.11.1", "#26053",
        "At start-up, with chunked prefill off and prefix caching not asked for, the "
        "long-prefill token threshold is set to 0 (no cap).", until="0.12.0",
        mirrors="vllm/config/vllm.py",
        applies_in=("scheduler.Scheduler.long_prefill_threshold",),
        matters_on="chunked_off_threshold and not caching"),
    RuleChange(
        "chunked_off_stops_at_first_misfit", "0.12.0", "#28911",
        "With chunked prefill off, admission stops at the first waiting request whose "
        "whole prompt does not fit the step's remaining budget, instead of setting it "
        "aside and trying the requests behind it.  (0.11.0 set such requests aside: "
        "quirks.SKIPPED_WAITING_REQUESTS_REVERSED.)",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler._schedule_waiting",),
        matters_on="chunked_off"),
    RuleChange(
        "chunked_local_frees_last_cached_page", "0.11.1", "#25431",
        "A chunked-local-attention group gives back every page before the chunk of the "
        "next token, the request's last cached page too (0.11.0 keeps that one; the "
        "pages to skip now come from get_num_skipped_tokens).  Found by hybrid streams "
        "on the 0.11.1 side environment.",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("group_managers.ChunkedLocalAttentionManager.remove_skipped_blocks",),
        matters_on="chunked_local_caching"),
    RuleChange(
        "grammar_rows_in_grant_order", "0.11.1", "#26866",
        "Structured output: the constrained requests' bitmask rows follow the order tokens "
        "were granted in (num_scheduled_tokens: running requests first, then admissions), "
        "and a request's index counts constrained requests only.  (0.11.0 follows the "
        "worker's batch, new then running then resumed, and indexes the whole batch.)  "
        "The engine now asks for the bitmask after schedule() (get_grammar_bitmask).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.grammar_batch",),
        matters_on="grammar"),
    RuleChange(
        "prefix_stats_split_preempted", "0.11.1", "#25787",
        "Scheduler stats: the prefix-cache lookups of a request preempted before are "
        "counted apart (preempted_requests, preempted_queries, preempted_hits) and no "
        "longer in requests, queries and hits.  Found by the stats streams on the 0.11.1 "
        "side environment.",
        mirrors="vllm/v1/core/kv_cache_manager.py",
        applies_in=("config.Config.prefix_stats_split_preempted",
                    "kv_cache_manager.KVCacheManager.counts_apart"),
        matters_on="stats"),
    RuleChange(
        "kv_events_name_the_adapter", "0.11.1", "#27728",
        "KV cache events: a BlockStored for a request with a LoRA adapter names the "
        "adapter's integer id.  (0.11.0 asks the adapter for an ``id`` it does not have "
        "and the engine raises AttributeError: quirks.KV_EVENTS_FAIL_WITH_LORA.)  Found by "
        "the first KV-event streams on 0.11.0.",
        mirrors="vllm/v1/core/block_pool.py",
        applies_in=("block_pool.BlockPool.announced_adapter",),
        matters_on="kv_events_lora"),
    RuleChange(
        "eagle_encoder_one_token_ahead", "0.12.0", "#29750",
        "Multimodal inputs with an eagle drafter: the drafter reads one position past "
        "the granted range, so a placeholder that starts right after the range needs its "
        "encoder output (or its cached output) this step, and an item that cannot be "
        "encoded now cuts the grant one token earlier (to nothing when the request has "
        "computed up to one token before it).  The whole-item cut of "
        "disable_chunked_mm_input is not shifted.  Found by the 0.12.0 upgrade check.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.drafter_reads_ahead",),
        matters_on="encoder_eagle"),
    RuleChange(
        "eagle_lookahead_item_waits", "0.13.0", "#30475",
        "A placeholder needed only by the eagle drafter's look-ahead (it starts right "
        "after the granted range) is still looked up in the encoder cache and must fit "
        "the encoder budget and cache, but it is encoded only once the range reaches it: "
        "the scheduler now encodes an item only when the range holds some of its "
        "embeddings.  Undone in 0.28.0 (#51603): the range whose embeddings decide is the "
        "granted range plus the drafter's look-ahead again, so such an item is encoded at "
        "once, as in 0.12.0.  Found by the 0.29.0 check of mm_eagle_reads_one_token_ahead.",
        until="0.28.0",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.encoder_grant",),
        matters_on="encoder_eagle"),
    RuleChange(
        "abort_skips_finished_requests", "0.11.1", "#25067",
        "An abort of a request that has finished but is still known to the scheduler "
        "(a KV connector is sending its pages) is ignored.  0.11.0 finished it again: its "
        "status became FINISHED_ABORTED, the connector's request_finished was called a "
        "second time and the worker was told of the finish again.  Found by the "
        "KV-connector streams of the 0.12.0 upgrade check; 0.11.1 has it already.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.abort_passes_over",),
        matters_on="connector_sends and aborts"),
    RuleChange(
        "kv_events_published_after_update", "0.11.1", "#25875",
        "The KV cache events a step gathered are published at the end of "
        "update_from_output, no longer at the end of schedule.  A synchronous step "
        "schedules and updates, so it publishes the same batch; under async scheduling a "
        "step that applies no batch publishes nothing, and its events go out with the "
        "next step that applies one.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.schedule", "scheduler.Scheduler.update_from_output"),
        matters_on="batch_queue and events_asked"),
    RuleChange(
        "async_skips_requests_at_max_tokens", "0.12.0", "#29542",
        "Async scheduling: a running request whose output placeholders already take it to "
        "max_tokens (computed + 2 - placeholders >= prompt + max_tokens) is passed over, "
        "so the extra position 0.11.0 schedules after a request's last token is no longer "
        "scheduled (the request is not known to have stopped when the next batch is "
        "scheduled, but it cannot need another token).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.placeholders_reach_max_tokens",),
        matters_on="async_scheduling"),
    RuleChange(
        "set_aside_order_kept", "0.14.0", "#32173",
        "Under fcfs, the requests set aside in a step come back to the head of the waiting "
        "queue in the order they were set aside: the queue now reverses them as it puts them "
        "back, undoing the reversal of quirks.SKIPPED_WAITING_REQUESTS_REVERSED.",
        mirrors="vllm/v1/core/sched/request_queue.py",
        applies_in=("scheduler.Scheduler.put_back",)),
    RuleChange(
        "window_hits_skipped_at_admission", "0.14.0", "#30166",
        "A new request's prefix-hit pages that lie wholly before the window of its hit "
        "and loaded tokens (sliding window, chunked local attention) are not taken: null "
        "pages stand in their place and the pages stay where they are in the free queue "
        "(0.11.0 took them and gave them back at the next step, to the tail).  Pages are "
        "counted per group with a floor of zero, and only the hit pages inside the window "
        "count as taken from the free queue.  Giving back the pages out of the window "
        "walks only the pages the request holds (the window may reach into tokens "
        "loaded from outside), where up to 0.13.0 it indexed past a short table.",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("group_managers.GroupManager.null_out_before",
                    "group_managers.GroupManager.pages_to_allocate",
                    "group_managers.GroupManager.save_hit",
                    "kv_cache_manager.KVCacheManager.allocate_slots")),
    RuleChange(
        "window_pages_freed_before_connector_finish", "0.14.0", "#30166",
        "Before the KV connector hears that a request finished (request_finished), the "
        "pages out of the window of all its tokens are given back and show as null pages "
        "in the block ids it is handed.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.connector_keeps_pages",)),
    RuleChange(
        "null_pages_never_cached", "0.14.0", "#30166",
        "Caching full pages passes over null pages, so a sliding-window page that left "
        "the window before it was cached is never indexed (quirks.NULL_PAGE_CACHED is "
        "gone).  A BlockStored event lists the hashes of the pages really indexed, and its "
        "parent is the request's hash of the page before, whatever page stands there "
        "(that half from #30544).",
        mirrors="vllm/v1/core/block_pool.py",
        applies_in=("block_pool.BlockPool.cache_full_blocks",),
        matters_on="sliding_caching or chunked_local_caching"),
    RuleChange(
        "connector_told_whole_table", "0.14.0", "#30166",
        "After an allocation the KV connector is told every page of the request's table "
        "(get_blocks), not only its prefix-hit pages and the pages just added, so a request "
        "whose asynchronous load is done hears of its loaded pages again when it is "
        "admitted.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.tell_connector_pages",),
        matters_on="connector"),
    RuleChange(
        "loaded_preempted_request_resumes", "0.14.0", "#31583",
        "A request preempted earlier whose asynchronous KV load is reported done goes back "
        "to PREEMPTED, no longer to WAITING, so it is admitted as a resumed request; while "
        "it cannot be admitted (no pages, no room for its whole sequence, ...) it shows as "
        "PREEMPTED.  Found by the 5,000-stream 0.19.0 upgrade check.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.waits_for_remote_kv",),
        matters_on="connector_async"),
    RuleChange(
        "failed_admission_lets_go_of_encoder_inputs", "0.14.0", "#31857",
        "A waiting request turned away because its pages cannot be allocated (from 0.19.0 "
        "also because its whole sequence would not fit) lets go of the encoder-cache "
        "entries its lookup found, so they can be evicted for other items; 0.11.0 kept "
        "them held by it until it was admitted or finished.  Found by the 5,000-stream "
        "0.19.0 upgrade check.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.not_admitted",),
        matters_on="encoder"),
    RuleChange(
        "hybrid_hit_searched_until_groups_agree", "0.14.0", "#31707",
        "Prefix caching over a full-attention group and another type: after the full "
        "hit and the other type's hit inside it, the other type is searched again inside "
        "the hit so far until a search shortens nothing.  With an eagle drafter every "
        "search drops its last page again, so the hit shrinks page by page, mostly to "
        "nothing (vLLM issue #32802).  0.15.1 and later search once again for this pair of "
        "types (0.15.1 has 0.16.0's search; found by the 0.15.1 upgrade check).",
        until="0.15.1",
        mirrors="vllm/v1/core/kv_cache_coordinator.py",
        applies_in=("kv_cache_coordinator.KVCacheCoordinator.hybrid_hit",),
        matters_on="hybrid_caching and eagle"),
    RuleChange(
        "hybrid_eagle_drop_once_per_group", "0.20.0", "#40860",
        "Prefix caching over a full-attention group and another type with an eagle "
        "drafter: the other type's search reaches one of its pages past the full hit "
        "(capped at the longest hit allowed) before it drops its last page, so the hit "
        "loses one page to eagle, not one per type (vLLM issue #32802).  vLLM drops only "
        "for the groups marked as the drafter's, and for every group when none is "
        "marked, as with the harness's groups.",
        mirrors="vllm/v1/core/kv_cache_coordinator.py",
        applies_in=("kv_cache_coordinator.KVCacheCoordinator.hybrid_hit",),
        matters_on="hybrid_caching and eagle"),
    RuleChange(
        "aborted_load_keeps_pages_until_done", "0.16.0", "#32255",
        "A request aborted while its asynchronous KV load runs (not yet reported done) "
        "keeps its pages until the worker reports the load done; they are freed then, after "
        "the step's other frees.  An abort after the load was reported done frees them at "
        "once, as 0.11.0 always did.  When the connector also keeps the pages to send them, "
        "the later of the two reports names a request no longer known and the engine raises "
        "AssertionError (quirks.ABORTED_LOAD_REPORTED_TWICE).  Found by the 5,000-stream "
        "0.19.0 upgrade check.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.load_under_way", "scheduler.Scheduler.take_transfers"),
        matters_on="connector_async and aborts"),
    RuleChange(
        "eagle_whole_item_cut_one_token_earlier", "0.17.0", "#34220",
        "With disable_chunked_mm_input and an eagle drafter, a grant that would end inside a "
        "placeholder it enters from before is cut one token before the placeholder (to "
        "nothing at the least), as the encoder-budget cut already was, so the drafter's read "
        "one position ahead stays out of it.  Found by the 5,000-stream 0.19.0 upgrade "
        "check.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.encoder_grant",),
        matters_on="chunked_mm_off and uses_eagle"),
    RuleChange(
        "grammar_rows_skip_prefill_chunks", "0.17.0", "#34765",
        "Structured output: a constrained request whose step leaves part of its known "
        "tokens uncomputed (a prefill chunk: it samples nothing) gets no bitmask row and no "
        "index; only requests that sample this step are listed.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.grammar_batch",)),
    RuleChange(
        "set_aside_requests_wait_apart", "0.18.0", "#35781",
        "Requests set aside in a step (waiting for a grammar or a KV load, turned away by "
        "the LoRA slots, not fitting whole with chunked prefill off, ...) and new requests "
        "that cannot run yet (grammar not ready) wait in a second queue "
        "(skipped_waiting) instead of going back to the head of the waiting queue.  Under "
        "fcfs that queue is served first; under priority the better of the two heads is "
        "taken.  So a request preempted after others were set aside now comes after them.  "
        "Undone in 0.31.0, where only requests holding pages wait apart "
        "(page_holders_wait_first).", until="0.31.0",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.waits_apart",)),
    RuleChange(
        "async_load_counts_tokens_at_once", "0.18.0", "#34616",
        "A request whose KV cache loads asynchronously counts its hit and loaded tokens as "
        "computed from the step the load starts (0.11.0: zero until the load is done).  "
        "Once done it keeps that count (less the last token when it covers every token), "
        "and its pages are cached for the whole count, not for every token its pages "
        "cover.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler._schedule_waiting",
                    "scheduler.Scheduler._take_loaded_tokens"),
        matters_on="connector_async"),
    RuleChange(
        "admission_reserves_whole_sequence", "0.19.0", "#37307",
        "A waiting request is admitted only when the free pages would hold all its tokens "
        "(capped at max_model_len) beyond its prefix hit, not only the tokens of its first "
        "chunk; when they would not, the waiting part of the step ends.  vLLM's "
        "scheduler_reserve_full_isl, on by default.  A prompt longer than the whole pool is "
        "therefore never admitted.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.fits_whole_sequence",)),
    RuleChange(
        "mm_hash_keys_carry_the_offset", "0.19.0", "#36708",
        "A multimodal item enters a block's key as its content hash and its offset from the "
        "block's start, and an item that ends exactly where a block starts no longer touches "
        "that block (half of quirks.MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING is gone; a later "
        "hashing still looks at the last item only).",
        mirrors="vllm/v1/core/kv_cache_utils.py",
        applies_in=("config.Config.mm_keys_carry_the_offset",),
        matters_on="encoder_and_caching"),
    RuleChange(
        "window_admission_capped", "0.20.0", "#40946",
        "The whole-sequence admission test (admission_reserves_whole_sequence) counts a "
        "sliding-window or chunked-local group's pages up to the most one request can hold "
        "at once: its window's earlier tokens (sliding_window - 1) plus a step's budget, "
        "one page more, or a chunk plus a step's budget, never more than max_model_len's "
        "pages.  The same count is used for the pages a prefill under way still needs "
        "(async_load_leaves_room_for_prefills).  Found by the 0.26.0 campaign (seed 1); "
        "0.20.0 and 0.20.1 apply the cap to every allocation as well "
        "(window_cap_on_every_allocation).",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("kv_cache_manager.KVCacheManager.admission_bound",),
        matters_on="sliding or chunked_local"),
    RuleChange(
        "window_cap_on_every_allocation", "0.20.0", "#40946",
        "The cap of window_admission_capped also bounds the page count of every "
        "allocation: a running request's window pages are counted up to the cap, yet as "
        "many pages are taken as its table grows by, so a pool short by those pages "
        "passes the count and the engine fails taking them (ValueError) where it would "
        "have turned the request away.  0.20.2 keeps the cap to the admission test.",
        until="0.20.2",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("kv_cache_manager.KVCacheManager.allocation_bound",),
        matters_on="sliding or chunked_local"),
    RuleChange(
        "waiting_stats_count_set_aside_apart", "0.20.0", "#38435",
        "Scheduler stats: num_waiting_reqs counts the waiting queue only; the requests "
        "waiting in the set-aside queue (skipped_waiting) are counted apart, in "
        "num_skipped_waiting_reqs.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.make_stats",)),
    RuleChange(
        "connector_finish_window_of_computed_tokens", "0.20.0", "",
        "The pages given back before the connector hears of a finish are those out of the "
        "window of the request's computed tokens, no longer of all its tokens (so the page "
        "of its last, uncomputed token's window start is kept).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.connector_keeps_pages",)),
    RuleChange(
        "admission_reserves_lookahead", "0.23.0", "#43733",
        "A waiting request admitted with a drafter that reads ahead (eagle) gets its "
        "lookahead slots at once, a new request too (0.11.0 reserved them only for a request "
        "that had computed tokens, a resumed one); only a request whose KV cache loads "
        "asynchronously gets none.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.admission_lookahead",)),
    RuleChange(
        "uncached_pages_reused_first", "0.23.0", "#43447",
        "Pages a sliding-window, chunked-local or Mamba group gives back while the request "
        "runs, and a sliding-window group's pages when the request finishes or is "
        "preempted, go to the head of the free queue when they hold no cached prefix (they "
        "are reused first, the last page freed first); cached ones join the tail as "
        "before.",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("group_managers.GroupManager.give_back",)),
    RuleChange(
        "window_of_one_indexes_nothing", "0.23.0", "#43447",
        "A sliding window of one token (the token itself), with no eagle drafter, indexes "
        "none of its full pages in the prefix cache, since no hit could ever need an "
        "earlier page of that group; such a group, and so the whole hybrid request, never "
        "hits, and its pages are reused first when given back.",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("group_managers.SlidingWindowManager.indexes_pages",)),
    RuleChange(
        "kv_pages_first_in_tensor", "0.23.0", "#42095",
        "KV sizing: the flash-attention backend's per-layer KV tensor puts the pages first "
        "(num_blocks, 2, block_size, heads, head size); 0.11.0 put K/V first.  The pool's "
        "pages and bytes are unchanged.",
        mirrors="vllm/v1/attention/backends/flash_attn.py",
        applies_in=("config.Config.kv_tensor_layout",)),
    RuleChange(
        "async_load_leaves_room_for_prefills", "0.23.0", "#44560",
        "A request whose KV cache would load asynchronously is admitted only if its pages fit "
        "in the free pages less those the prefills under way still need for their whole "
        "sequence (capped at max_model_len): the requests admitted and left mid-prefill and "
        "the other asynchronous loads not yet admitted again.  Otherwise the waiting part of "
        "the step ends, as when pages are short.  Found by the 0.26.0 campaign (seed 1); "
        "0.22.1's scheduler has no such reservation, 0.23.0's has it.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.reserved_for_prefills",),
        matters_on="connector_async"),
    RuleChange(
        "lone_group_must_divide_block_size", "0.23.0", "#44165",
        "At start-up the KV cache coordinator asserts that the scheduler's block size (the "
        "cache block size for one group, the least common multiple of the groups' page "
        "sizes for several) is a multiple of every group's page size: a lone Mamba group, "
        "whose page holds max_model_len tokens, makes the engine raise AssertionError.  "
        "Found by the 0.26.0 campaign (seed 1); 0.22.1's coordinator has no such check.",
        mirrors="vllm/v1/core/kv_cache_coordinator.py",
        applies_in=("kv_cache_manager.KVCacheManager.__init__",),
        matters_on="lone_group"),
    RuleChange(
        "encoder_outputs_held_for_the_drafter", "0.24.0", "#46315",
        "Multimodal inputs with an eagle drafter: a request lets go of an item's encoder "
        "output only once its computed tokens pass the item's end by the drafter's "
        "read-ahead (one token), not as soon as they reach it, so the entry stays "
        "referenced one step longer and cannot be evicted for another item.  Undone in "
        "0.33.0.  Found by the 0.32.0 check (seed 1).", until="0.33.0",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.encoder_free_lookahead",),
        matters_on="encoder and uses_eagle"),
    RuleChange(
        "placeholder_tokens_hold_encoder_outputs", "0.24.0", "#45347",
        "Multimodal under async scheduling: the test that lets go of an item's encoder "
        "output counts the request's computed tokens less its output placeholders, tokens "
        "scheduled whose sample is not in yet (pipeline stages make none); the outputs are "
        "taken in before their placeholders are removed, so a request that decodes past its "
        "image holds it until the step after, and another image that needs the room waits.  "
        "0.23.0 counted the placeholders as computed.  Found by the 0.34.0 check of the "
        "encoder_handoffs property.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler._free_computed_encoder_inputs",),
        matters_on="encoder and batch_queue"),
    RuleChange(
        "every_uncached_page_reused_first", "0.24.0", "#42656",
        "Every page given back (a finished or preempted request's, of any group) goes to "
        "the head of the free queue when it holds no cached prefix, in the order given, so "
        "it is reused before any cached page is evicted; cached pages join the tail as "
        "before.  0.23.0 did this for sliding-window, chunked-local and Mamba pages only.",
        mirrors="vllm/v1/core/block_pool.py",
        applies_in=("block_pool.BlockPool.reuses_uncached_first",)),
    RuleChange(
        "new_decode_padded_with_drafts", "0.25.0", "#45237",
        "With drafting on (num_speculative_tokens > 0), a waiting request with one token "
        "left to compute, met while every running request scheduled in the step decodes (at "
        "least one is scheduled, none was left mid-prefill by its last grant), is granted "
        "1 + num_speculative_tokens positions, the extra ones placeholder drafts (-1) that "
        "the model rejects; if the padded grant exceeds the step's budget or max_model_len, "
        "the waiting part of the step ends.  Found by the 0.26.0 campaign (seed 1); 0.24.0's "
        "scheduler has no such padding, 0.25.0's has it.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.decode_padding",),
        matters_on="drafts"),
    RuleChange(
        "connector_finish_sees_computed_pages", "0.25.0", "#46694",
        "The block ids a KV connector is handed when a request finishes (request_finished) "
        "stop at the pages holding its computed tokens: pages allocated only for the "
        "lookahead (an eagle drafter's slots) are left out.  Found by the 0.26.0 campaign "
        "(seed 1); 0.24.0's scheduler hands the whole table, 0.25.0's the computed pages.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.connector_keeps_pages",),
        matters_on="connector"),
    RuleChange(
        "decode_padding_leaves_room_to_sample", "0.29.0", "#53962",
        "The padding of new_decode_padded_with_drafts is applied only when max_model_len "
        "also leaves room for the token sampled after it; otherwise the request is granted "
        "its one token unpadded, and only a padded grant over the budget ends the waiting "
        "part of the step.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.check_padded_grant",
                    "scheduler.Scheduler.decode_padding"),
        matters_on="drafts"),
    RuleChange(
        "startup_check_holds_back_null_page", "0.29.0", "#47272",
        "KV sizing: the start-up check that one max_model_len request fits plans with the "
        "memory less one page of every layer, the null page the block pool keeps back; a "
        "pool of exactly that request's pages (with what is left over less than a page) is "
        "refused at start-up, where 0.11.0 started it and the request could never be "
        "scheduled.  The pool is still cut from the whole memory.  Found by the 0.30.0 "
        "campaign (seed 1).",
        mirrors="vllm/v1/core/kv_cache_utils.py",
        applies_in=("config.Config.start_up_holds_back_null_page",),
        matters_on="from_memory"),
    RuleChange(
        "window_pages_cached_sparsely", "0.29.0", "#52216",
        "Prefix caching keeps fewer sliding-window pages: vLLM's prefix_cache_retention_"
        "interval becomes a start-up setting whose default is 0 (from 0.24.0 it was an "
        "environment variable, unset: every full page indexed).  A sliding-window group "
        "indexes only the pages a later hit can start from: the window's pages ending at "
        "the page boundary at or before the prompt's last token, and at or before where "
        "the full-attention groups' hit ended when the window's cut it short (the shared "
        "prefix).  Its other full pages are never indexed, so they go back to the head of "
        "the free queue and a later request's window hit finds only those tails.",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("group_managers.SlidingWindowManager.pages_indexed",
                    "kv_cache_manager.KVCacheManager.get_computed_blocks"),
        matters_on="sliding_caching"),
    RuleChange(
        "eagle_window_tails_at_replay_hits", "0.30.0", "#54713",
        "With an eagle drafter, window_pages_cached_sparsely keeps the window's pages at "
        "the hits a later request can reach, not at the prompt's last token: one page below "
        "the last page boundary at or before the last prompt token (the same prompt sent "
        "again: its hit stops before that token and drops a page) and one page below the "
        "boundary at or before the prompt's end (a longer prompt).  In 0.29.0 an eagle "
        "request sending the same prompt again found no window pages to hit.",
        mirrors="vllm/v1/core/single_type_kv_cache_manager.py",
        applies_in=("group_managers.SlidingWindowManager.replay_points",),
        matters_on="sliding_caching and eagle"),
    RuleChange(
        "eagle_search_reaches_the_last_key", "0.32.0", "",
        "With an eagle drafter and several KV cache groups, the prefix search that drops "
        "its last page looks as far as the request's keys go (its whole pages), not only "
        "up to the last prompt token: a prompt of whole pages sent again hits all its "
        "pages but the last, where it hit all but two.  (From 0.33.0 an eagle request with "
        "prefix caching keys its pages one token ahead and drops none: "
        "eagle_hashes_cover_the_next_token.)",
        mirrors="vllm/v1/core/kv_cache_coordinator.py",
        applies_in=("kv_cache_coordinator.KVCacheCoordinator.eagle_search_end",),
        matters_on="hybrid_caching and eagle"),
    RuleChange(
        "async_load_reserves_a_draft_step", "0.31.0", "#57104",
        "With drafting on, an asynchronous load is admitted only if it fits in the free "
        "pages less, beyond what async_load_leaves_room_for_prefills keeps, the pages of "
        "one decode step with drafts (1 + num_speculative_tokens + an eagle drafter's "
        "lookahead slots, in pages of block_size), once for the load itself and once for "
        "each prefill under way.  Found by the 0.34.0 campaign (seed 1).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.draft_step_pages",),
        matters_on="connector_async and drafts"),
    RuleChange(
        "draft_step_counted_in_each_group", "0.32.0", "",
        "The draft step of async_load_reserves_a_draft_step is counted in each KV cache "
        "group's pages (added up over the groups but Mamba ones) for the load itself, and "
        "for a prefill under way with its sequence: the pages of its whole sequence plus "
        "the step's tokens, not the two rounded up apart.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.draft_step_pages",
                    "scheduler.Scheduler.reserved_for_prefills"),
        matters_on="connector_async and drafts"),
    RuleChange(
        "whole_item_cut_before_lookups", "0.32.0", "",
        "With chunked multimodal input off, the check that a grant would stop inside an "
        "item comes before the item is looked up, so it also cuts the grant before an item "
        "whose hash the step encodes already (an earlier item of the request) or the "
        "encoder cache holds; up to 0.31.0 such an item was passed over and could be split.  "
        "Found by the 0.34.0 campaign (seed 1).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.encoder_grant",),
        matters_on="chunked_mm_off"),
    RuleChange(
        "threshold_above_max_model_len_refused", "0.27.0", "#49244",
        "Start-up refuses a config whose long_prefill_token_threshold is greater than "
        "max_model_len (vLLM's scheduler config validation); up to 0.26.0 that was refused "
        "only with several partial prefills (max_num_partial_prefills > 1).  Found by the "
        "0.34.0 campaign (seed 1).",
        mirrors="vllm/config/scheduler.py",
        applies_in=("config.Config.start_up_refusal",),
        matters_on="threshold_above_model_len"),
    RuleChange(
        "sending_requests_keep_the_engine_stepping", "0.22.0", "#43433",
        "With a KV connector, a finished request whose pages the connector is still sending "
        "keeps the engine stepping: has_requests holds while the scheduler still knows a "
        "request that is in no queue, so EngineCore schedules and updates (stats, the "
        "worker's transfer report) in the idle steps until the send is reported done, "
        "where 0.11.0 idled.  Found by the 0.34.0 campaign (seed 1).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.has_requests",),
        matters_on="connector_sends"),
    RuleChange(
        "window_cap_counts_batches_in_flight", "0.26.0", "#47728",
        "The cap of window_admission_capped counts the budget of every batch in flight, not "
        "one step's: twice the budget under async scheduling, the pipeline stages' number "
        "of times with pipeline parallelism (vLLM's max_in_flight_tokens).",
        mirrors="vllm/config/vllm.py",
        applies_in=("scheduler.Scheduler.tokens_in_flight",),
        matters_on="(sliding or chunked_local) and batch_queue"),
    RuleChange(
        "window_frees_wait_for_outputs", "0.26.0", "#47728",
        "A sliding-window or chunked-local group gives back the pages out of the window of "
        "the tokens whose output is applied: tokens of batches still in flight (async "
        "scheduling, pipeline stages) do not count, as they may still read the pages.  This "
        "holds for the pages given back before an allocation and before the KV connector "
        "hears of a finish.",
        mirrors="vllm/v1/core/kv_cache_manager.py",
        applies_in=("kv_cache_manager.KVCacheManager.processed_tokens",),
        matters_on="(sliding or chunked_local) and batch_queue"),
    RuleChange(
        "kv_packed_in_last_dim", "0.26.0", "#44455",
        "KV sizing: the flash-attention backend's per-layer KV tensor has no K/V axis any "
        "more; K and V of a token sit side by side in the last axis and the KV heads come "
        "before the tokens: (num_blocks, heads, block_size, 2 x head size).  The pool's "
        "pages and bytes are unchanged.  Found by the 0.26.0 upgrade check "
        "(kv_pool_from_memory).",
        mirrors="vllm/v1/attention/backends/flash_attn.py",
        applies_in=("config.Config.kv_tensor_layout",),
        matters_on="from_memory"),
    RuleChange(
        "passed_over_victim_keeps_the_pass", "0.28.0", "#49206",
        "Under the priority policy, a preemption victim that the pass over the running "
        "requests had already passed over in the same step without scheduling it (its "
        "tokens in flight, no encoder budget, ...) steps the pass back one place when it "
        "leaves the running list, so the request right after the current one is still "
        "visited; up to 0.27.1 only a victim scheduled earlier in the step did (vLLM issue "
        "#49097, docs/findings.md).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler._pick_victim",),
        matters_on="priority"),
    RuleChange(
        "encoder_frees_wait_for_outputs", "0.20.0", "#38907",
        "Multimodal: the encoder outputs a request has computed past are let go of when the "
        "step's outputs are taken in, no longer right after the step is scheduled; with "
        "async scheduling (or a batch queue) the next step is scheduled while they are "
        "still held, so an item that needs their room waits a step (vLLM issue #38551).  "
        "Found by the 0.28.0 campaign (seed 1); 0.19.1 frees them at once, 0.20.0 does "
        "not.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler._advance_computed_tokens",
                    "scheduler.Scheduler.update_from_output"),
        matters_on="encoder"),
    RuleChange(
        "items_taken_per_request", "0.23.0", "#44212",
        "Multimodal: the encoder cache remembers, per request, the items that request found "
        "cached or had encoded, and lets go of only those when an item is computed past or "
        "the request leaves; up to 0.22.1 it let go of every item whose hash was in the "
        "cache, so a request whose computed tokens passed one copy of a repeated image freed "
        "the entry another copy still needed.  Found by the 0.30.0 check of a stream that "
        "reuses an image hash with another length.",
        mirrors="vllm/v1/core/encoder_cache_manager.py",
        applies_in=("scheduler.Scheduler.__init__",),
        matters_on="encoder"),
    RuleChange(
        "batch_queue_fills_before_applying", "0.23.0", "#42187",
        "Engine loop, with a batch queue (async scheduling or pipeline stages): a step "
        "applies the oldest batch only when the queue is full or the scheduler holds no "
        "request after scheduling.  A worker already done with the oldest batch no longer "
        "makes the step apply it (the stream's async_ready_steps change nothing), and a "
        "step that schedules no tokens while requests remain queues its empty batch "
        "instead of applying at once.  Found by the vllm-core engine (vLLM's own "
        "EngineCore) on 0.34.0.",
        mirrors="vllm/v1/engine/core.py",
        applies_in=("config.Config.batch_queue_fills_before_applying",),
        matters_on="batch_queue"),
    RuleChange(
        "held_to_last_occurrence", "0.29.0", "#54284",
        "Multimodal: a request that took the same item at several places holds the encoder "
        "cache entry until it lets go of the last of them; up to 0.28.0 letting go of the "
        "first made the entry freeable (and evictable) while the others still needed it.",
        mirrors="vllm/v1/core/encoder_cache_manager.py",
        applies_in=("scheduler.Scheduler.__init__",),
        matters_on="encoder"),
    RuleChange(
        "recached_outputs_not_freed", "0.28.0", "#52482",
        "The encoder-cache hashes the worker is told to free leave out those cached again "
        "since they were evicted (an item evicted early in a step and encoded again later "
        "in it): the worker keeps that output.",
        mirrors="vllm/v1/core/encoder_cache_manager.py",
        applies_in=("scheduler.Scheduler._make_output",),
        matters_on="encoder"),
    RuleChange(
        "no_caching_frees_to_the_tail", "0.27.0", "#48017",
        "With prefix caching off, every page given back joins the tail of the free queue in "
        "the order given (every_uncached_page_reused_first and its 0.23.0 forerunner put "
        "them at the head), so freed pages are reused last.  0.28.0 (#51482) puts them at "
        "the head again.", until="0.28.0",
        mirrors="vllm/v1/core/block_pool.py",
        applies_in=("block_pool.BlockPool.reuses_uncached_first",),
        matters_on="not caching"),
    RuleChange(
        "prefix_stats_counted_at_admission", "0.27.0", "#48860",
        "Scheduler stats: a waiting request's prefix-cache lookup is counted (requests, "
        "queries, hits, or their preempted_ counterparts) only in the step whose page "
        "allocation admits it (or starts its asynchronous load), once; a lookup of a "
        "request then set aside, refused pages or cut to nothing is not counted, so a "
        "request tried at several steps no longer counts at each.  Found by the 0.29.0 "
        "check of aborted_load_keeps_pages_until_done.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("kv_cache_manager.KVCacheManager.counts_at_admission",),
        matters_on="stats_caching"),
    RuleChange(
        "padding_without_running_requests", "0.30.0", "#55126",
        "The padding of new_decode_padded_with_drafts no longer needs a running request "
        "scheduled in the step when the waiting request has tokens computed already (a "
        "prefix hit, a load, a resumed request); one with nothing computed still needs one "
        "(none may be left mid-prefill, as before).  Found by "
        "the 0.30.0 check of loaded_preempted_request_resumes and "
        "real_azure_conv_priority_drafts.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.pads_without_running",),
        matters_on="drafts"),
    RuleChange(
        "placeholder_leaves_last_row_unfilled", "0.30.0", "#48200",
        "Structured output: after a placeholder draft (-1, the padding of "
        "new_decode_padded_with_drafts) the bitmask row of the token sampled after the "
        "drafts is left unfilled too, like the rows of the drafts after the placeholder; "
        "the placeholder's own row is still filled.  Found by the 0.33.0 check (seed 1).",
        mirrors="vllm/v1/structured_output/__init__.py",
        applies_in=("scheduler.Scheduler.grammar_batch",),
        matters_on="grammar_drafts"),
    RuleChange(
        "threshold_lifted_for_a_lone_request", "0.31.0", "#57951",
        "The long-prefill token threshold caps nothing in a step that starts with a single "
        "unfinished request (running or waiting): there is no other request to hold back.  "
        "Found by the 0.31.0 check (long_prefill_threshold and five other streams).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.long_prefill_threshold",),
        matters_on="threshold"),
    RuleChange(
        "external_hit_ignored_without_prefix_reads", "0.31.0", "#57269",
        "A request that reads no prefix cache (prompt logprobs) still asks the KV "
        "connector, but its answer is taken as nothing to load: no external tokens, no "
        "asynchronous load, and no waiting when the connector cannot tell yet.  Found by "
        "the 0.31.0 check of aborted_load_keeps_pages_until_done.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.external_hit",),
        matters_on="connector_loads and prompt_logprobs"),
    RuleChange(
        "later_hashing_sees_every_item", "0.31.0", "#51694",
        "A later hashing of a request's blocks (blocks completed by outputs) looks at every "
        "multimodal item the block touches, from the first one not ended before it, as the "
        "first hashing does; quirks.MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING is gone.  Found "
        "by the 0.31.0 check of mm_later_hashing_sees_last_item_only.",
        mirrors="vllm/v1/core/kv_cache_utils.py",
        applies_in=("scheduler.Scheduler.add_request",),
        matters_on="encoder_and_caching"),
    RuleChange(
        "page_holders_wait_first", "0.31.0", "#58947",
        "The set-aside queue of 0.18.0 is gone: requests set aside go back to the head of "
        "the waiting queue in the order set aside, and a new request whose grammar is not "
        "ready waits there in arrival order.  Only waiting requests that hold pages (tokens "
        "computed, or an asynchronous load) wait apart, in a queue served before the "
        "waiting queue under either policy.  Stats: a request set aside (or arrived "
        "waiting for its grammar) counts in num_skipped_waiting_reqs, not "
        "num_waiting_reqs, until it is admitted, wherever it waits.  Found by the 0.31.0 "
        "check of grammar_waiting_request_served_first.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.holders_wait_first",)),
    RuleChange(
        "lora_slots_held_by_every_running_request", "0.33.0", "",
        "The step's LoRA slots are taken by the adapters of every running request, also "
        "one that gets no token this step, so a waiting request under another adapter "
        "cannot slip into a slot that a skipped running request still needs; "
        "quirks.LORA_SLOTS_OVERFILLED_AFTER_A_SKIP is gone.  Found by the 0.33.0 check of "
        "lora_slots_overfilled_after_a_skip.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.adapter_holders",),
        matters_on="lora"),
    RuleChange(
        "priority_self_preemption_goes_on", "0.33.0", "",
        "Under the priority policy, a running request that preempts itself (it was the "
        "least urgent) no longer ends the pass over the running requests: the more urgent "
        "ones after it are still tried, in the pages it gave back.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.goes_on_after_self_preemption",),
        matters_on="priority"),
    RuleChange(
        "encoder_cut_sets_aside", "0.33.0", "",
        "A waiting request whose grant an item that cannot be encoded now cuts to nothing "
        "is set aside for the step, and the requests behind it get their turn (0.11.0 "
        "ended the waiting part there).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler._schedule_waiting",),
        matters_on="encoder"),
    RuleChange(
        "outputs_update_the_cache_at_once", "0.33.0", "",
        "When a running request's outputs are applied, a stop leaves the dropped tokens "
        "out of its computed count (0.11.0 kept them counted), and with drafts configured "
        "(or output placeholders, async scheduling) the pages its computed tokens fill are "
        "cached at once, before a stop frees them, instead of at its next allocation.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("async_scheduler.AsyncScheduler._append_outputs",
                    "scheduler.Scheduler._after_outputs"),
        matters_on="drafts or batch_queue"),
    RuleChange(
        "eagle_hashes_cover_the_next_token", "0.33.0", "#50897",
        "With an eagle drafter, prefix caching and no KV connector, a block's prefix-cache "
        "key also covers the token after the block (and the items that token touches), "
        "since the drafter's KV at the block's last position depends on it; a block is "
        "keyed only once that token is known.  The eagle hit no longer gives back its last "
        "block.  Found by the 0.34.0 check of spec_eagle_lookahead_drop_last_hit and "
        "hybrid_eagle_sliding_window_hit (0.33.0's eagle streams were not driven).",
        mirrors="vllm/v1/core/kv_cache_utils.py",
        applies_in=("scheduler.Scheduler.hash_lookahead_tokens",),
        matters_on="eagle_and_caching"),
    RuleChange(
        "threshold_needs_chunked_prefill", "0.34.0", "",
        "With chunked prefill off the long-prefill token threshold caps nothing: a request "
        "that cannot be chunked is not held back.  Found by the 0.34.0 check of "
        "set_aside_threshold_caps_first.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.long_prefill_threshold",),
        matters_on="chunked_off_threshold"),
    RuleChange(
        "unchunked_mm_prompt_not_split", "0.34.0", "",
        "With chunked prefill off, a waiting request whose grant an item that cannot be "
        "encoded now (encoder budget or cache) cuts short of its whole sequence gets "
        "nothing this step: it lets go of the encoder-cache entries its lookup took and is "
        "set aside (0.33.0's encoder_cut_sets_aside), so the requests behind it get their "
        "turn; up to 0.33.0 it ran the partial prefill.  Found by the 0.34.0 check of "
        "failed_admission_lets_go_of_encoder_inputs.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.unchunked_prompt_cut",),
        matters_on="encoder and chunked_off"),
    RuleChange(
        "grammar_keeps_first_invalid_draft", "0.34.0", "",
        "Structured output: a request's new drafts are cut after the first one its grammar "
        "rejects, which stays (0.11.0 cut before it), and the bitmask rows after a rejected "
        "or placeholder draft are left unfilled, so the model rejects that draft.  Found by "
        "the 0.34.0 check of grammar_cuts_drafts.",
        mirrors="vllm/v1/structured_output/__init__.py",
        applies_in=("scheduler.Scheduler.keeps_first_invalid_draft",),
        matters_on="grammar_drafts"),
    RuleChange(
        "encoder_cuts_at_the_item", "0.33.0", "",
        "Multimodal: an item that cannot be encoded now (encoder budget or cache) cuts the "
        "grant right before its placeholder, no longer one token earlier for an eagle "
        "drafter, and never lengthens it (an item only the drafter's read-ahead reaches no "
        "longer cuts the grant); and with disable_chunked_mm_input a range that starts "
        "right at a placeholder and would end inside it is cut to nothing too.  Found by "
        "the 0.34.0 check of mm_eagle_reads_one_token_ahead (0.33.0's eagle streams were "
        "not driven).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.encoder_grant",),
        matters_on="encoder"),
    RuleChange(
        "encoder_length_mismatch_fails_request", "0.31.0", "#57696",
        "Multimodal: an item whose hash the encoder cache holds, or an earlier item of the "
        "same step holds, with another length gets its request nothing that step (the "
        "encoder budget stays as it was at that item), and once the step's outputs are in "
        "the request is finished with an error (FINISHED_ERROR), its pages freed.  0.30.0 "
        "took the cached output of the other length.  Found by the 0.34.0 campaign: streams "
        "reuse an image hash with another length, as a client reusing a UUID would.",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.encoder_grant",),
        matters_on="encoder"),
    RuleChange(
        "range_inside_item_waits_for_the_rest", "0.34.0", "",
        "Multimodal, with disable_chunked_mm_input: a range that starts inside a placeholder "
        "(a prefix hit or a KV connector's load ended inside it) and would end inside it "
        "gets nothing until the rest of the item fits; 0.33.0 protected only a range "
        "starting at or before the placeholder and granted the tokens up to the budget.  "
        "Found by an unseen-seed sweep on 0.34.0 (fuzz seeds 124 and 125).",
        mirrors="vllm/v1/core/sched/scheduler.py",
        applies_in=("scheduler.Scheduler.encoder_grant",),
        matters_on="chunked_mm_off"),
)

_BY_NAME = {c.name: c for c in CHANGES}

#: Whether a named rule change applies (``Config.has``), as the code of a rule asks it.
HasRule = Callable[[str], bool]


def only_0_11_0(rule_change: str) -> bool:
    """The rules of vLLM 0.11.0: no later rule change applies."""
    return False


def order(release: str) -> tuple[int, ...]:
    """A sort key for release numbers (major, minor, patch); suffixes such as ``rc1``,
    ``.post1`` or ``+cpu`` do not move a release past the next one."""
    parts = []
    for p in release.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def is_described(release: str) -> bool:
    return release in RELEASES


def newest_described(release: str) -> str:
    """The release whose rules describe ``release`` best: itself when described, else the
    newest described release before it, else 0.11.0."""
    older = [r for r in RELEASES if order(r) <= order(release)]
    return older[-1] if older else RELEASES[0]


def changes_in(release: str) -> tuple[RuleChange, ...]:
    """The rule changes in effect at ``release`` (none at 0.11.0)."""
    if release not in RELEASES:
        raise ValueError(f"the reference does not describe vLLM {release} "
                         f"(it describes {', '.join(RELEASES)})")
    return tuple(c for c in CHANGES if c.in_effect(release))


def rules_of(release: str) -> frozenset[str]:
    return frozenset(c.name for c in changes_in(release))


def changes_between(old: str, new: str) -> tuple[RuleChange, ...]:
    """The changes whose effect differs between two described releases."""
    a, b = rules_of(old), rules_of(new)
    return tuple(c for c in CHANGES if (c.name in a) != (c.name in b))


def change(name: str) -> RuleChange:
    return _BY_NAME[name]
