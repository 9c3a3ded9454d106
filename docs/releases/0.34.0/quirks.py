"""Where vLLM 0.11.0 behaves oddly, and the reference follows it on purpose.

Conformance means 0.11.0's behaviour, not the behaviour vLLM meant to have.
Each quirk below is reproduced by the code that names it.  Where a later
release changed it, the change is a named rule change of ``reference.releases``.

PRIORITY_VICTIM_KEEPS_ITS_GRANT
    Under the priority policy, a running request that cannot get pages preempts
    the running request with the largest (priority, arrival_time) -- which may
    be one already scheduled earlier in the same step.  0.11.0 removes the
    victim from the step's list of scheduled running requests, but not from
    ``num_scheduled_tokens``, not from the new-block map and not from the spent
    budget.  Consequences, all reproduced: the victim's tokens are still counted
    as computed by ``_update_after_schedule`` (it sits in the waiting queue with
    ``num_computed_tokens > 0`` and no pages), the scripted model still answers
    for it, ``update_from_output`` may append tokens to it or finish it while it
    waits, and when it is admitted again it skips the prefix lookup and
    allocates pages for every token up to its stale count.  The running loop's
    index also skips the request that slid into the victim's place.
    Changed in 0.11.1 (releases: priority_victim_loses_its_grant): vLLM PR
    #26661 ("[Bugfix][Core] Fix block table out-of-range issue in priority
    scheduling", fixing issue #23316) drops such a victim's entries from
    ``num_scheduled_tokens``, the new-block map and the drafts, returns its
    budget, and steps the running index back (the skipped index is vLLM
    issue #49097).
    Code: scheduler.Scheduler._pick_victim, Scheduler._schedule_waiting.

PRIORITY_VICTIM_INDEX_ERROR
    A consequence of the first quirk for sliding-window and chunked-local groups.
    The victim waits with its stale grant as ``num_computed_tokens`` and no
    pages; when it is admitted again, the pages before the window of that count
    are given back first, and the walk back from the window's first page indexes
    the empty block table: the engine raises ``IndexError`` (a sliding window
    once the stale grant reaches ``sliding_window - 1 + block_size`` tokens,
    chunked local attention once it reaches the chunk size).  The reference
    indexes its table the same way and raises at the same step.  Gone in 0.11.1
    with the first quirk; from 0.14.0 (releases: window_hits_skipped_at_admission)
    the walk is also capped to the table.  Bundled stream:
    priority_victim_window_index_error (found by an unseen fuzz seed).
    Code: group_managers.GroupManager.null_out_before.

SKIPPED_WAITING_REQUESTS_REVERSED
    With chunked prefill off, waiting requests too long for the remaining budget
    are set aside and put back at the head afterwards; under fcfs, several set
    aside in one step come back in reverse order (each is prepended to the
    set-aside queue).  Code: scheduler.Scheduler.set_aside.

REJECTED_DRAFTS_ALWAYS_SUBTRACTED
    Rejected drafts are subtracted from ``num_computed_tokens`` even for a
    request that was preempted in the same step (see the first quirk), whose
    count had restarted from 0 and holds only this step's grant.
    Code: scheduler.Scheduler._take_back_rejected.

LORA_SLOTS_OVERFILLED_AFTER_A_SKIP
    A step's adapter slots are counted from the running requests it schedules;
    a running request that gets no token (its next placeholder cannot be
    encoded: the encoder budget is spent) is not among them, so its adapter
    holds no slot that step and a waiting request under another adapter can be
    admitted into it.  When the skipped request runs again, the step's running
    requests hold more than ``max_loras`` adapters and vLLM's step fails its
    assertion: the engine raises ``AssertionError`` (seen on 0.11.0 to 0.13.0
    and 0.18.1).  The reference raises at the same step.  Gone in 0.33.0
    (releases: lora_slots_held_by_every_running_request): every running
    request's adapter holds a slot, so the check cannot fail.
    Bundled stream: lora_slots_overfilled_after_a_skip.
    Code: lora.AdapterSlots.check_not_overfilled.

NULL_PAGE_CACHED
    A sliding-window group gives back the pages that left the window and puts
    the null page in their place, without asking whether they were cached yet.
    With speculative decoding a page can be filled by accepted drafts (caching
    stops at the request's real tokens when it is allocated) and leave the
    window before the next allocation caches it -- when the window is shorter
    than the drafts, roughly.  That allocation then indexes the null page
    under the page's hash, and the next time the null page comes up for
    caching, ``BlockPool.cache_full_blocks`` fails its assertion that the page
    is not cached yet: the engine raises ``AssertionError``.  The reference
    raises at the same step (the harness counts a crash both engines raise
    alike as conforming, and says so).  Bundled stream:
    sliding_window_null_page_cached.  Code: block_pool.BlockPool.cache_full_blocks,
    group_managers.SlidingWindowManager.remove_skipped_blocks.

KV_EVENTS_FAIL_WITH_LORA
    With KV cache events on, the block pool announces each run of newly cached
    pages with the request's LoRA adapter, which it asks for an ``id``; vLLM
    0.11.0's ``LoRARequest`` has no such attribute (its id is ``lora_int_id``,
    or ``adapter_id``).  The first time a request with an adapter gets a page
    cached, the engine raises ``AttributeError``.  The reference raises at the
    same step.  Changed in 0.11.1 (releases: kv_events_name_the_adapter, vLLM PR
    #27728).  Bundled stream: kv_events_with_lora.
    Code: block_pool.BlockPool.announced_adapter.

MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING
    A block's keys include the content hash of every multimodal item it touches,
    and an item that ends exactly where a block starts counts as touching it.
    The first hashing of a request (its prompt's full blocks) looks at the items
    in order and moves past an item once a block has reached its end, so the
    block after it does not get its hash.  A later hashing (a block completed by
    outputs) starts looking again, at the last item only.  So when the last
    placeholder ends on a block edge inside the prompt's unfinished last block,
    that block gets the image's hash if outputs complete it, but not if a longer
    prompt completes it at once: the same tokens and images give two keys, and
    the longer prompt misses the prefix hit.  And a block completed later that
    holds two placeholders gets only the last one's hash.  Gone in two halves:
    0.19.0 (mm_hash_keys_carry_the_offset) passes over an item ending at the
    block's start, 0.31.0 (later_hashing_sees_every_item) looks at every item.
    Code: block_hash.mm_keys, block_hash.first_item_to_look_at.

ABORTED_LOAD_REPORTED_TWICE (in releases.aborted_load_keeps_pages_until_done; its mutant takes it away)
    From 0.16.0 (releases: aborted_load_keeps_pages_until_done, vLLM PR #32255) a
    request aborted while its asynchronous KV load runs keeps its pages until the
    worker reports the load done.  When its connector also keeps the pages to send
    them, two reports come: whichever comes first frees the request, and the second
    names a request the scheduler no longer knows, which ``_update_from_kv_xfer_finished``
    asserts against: the engine raises ``AssertionError`` (0.15.1 kept the request for
    the send and only noted the load).  The reference raises at the same step.
    Code: scheduler.Scheduler.take_transfers.

STALE_WORKER_ROWS
    The worker's block table rows are fixed-size and not cleared when a row is
    rewritten, so a slot looked up past a row's length reads an old page id.
    Code: slot_mapping.WorkerBlockTable.  No stream can show it in the harness
    (one row per request, rewritten whole on admission; see the equivalent
    mutant worker_rows_cleared); it is kept so the worker reads as vLLM's does.

ENCODER_DECODER_FREEABLE_COUNTED_TWICE
    An encoder-decoder model's scheduler schedules a request's encoder inputs
    without looking them up in the encoder cache first.  So an item whose output
    sits in the cache, freeable, is allocated again: its room is taken a second
    time while the entry stays among the freeable ones, and once the request lets
    go of it ``num_freeable_slots`` counts it twice.  An eviction that relies on
    that count runs out of freeable entries and vLLM raises ``KeyError``
    ("dictionary is empty"); the reference raises the same at the same call.  Only
    the encoder cache's own property reaches it (tests/test_encoder_cache_conformance.py,
    found by an unseen seed): the reference's scheduler has no encoder-decoder path.
    Later releases give encoder-decoder models a cache of their own.
    Code: encoder_cache.EncoderCacheManager.evict_until.
"""
