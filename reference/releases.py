"""The releases the reference describes, as named rule changes over vLLM 0.11.0.

The reference's modules state vLLM 0.11.0's rules.  Each later release is
0.11.0 plus the rule changes listed here, in the spirit of
ethereum/execution-specs' forks: a change has a name, the release that first
has it (and the release that undid it, if one did), the vLLM pull request
where known, and what changed.  The code that applies a rule asks
``config.has(name)`` at the one place the rule lives, so reading a rule's
function shows both versions of it.

Only behaviour the harness can observe is listed: what a stream decides
(token counts, pages, preemptions, hits, stops, events).  Refactors, renamed
internals and features the streams never turn on (speculative decoding under
async scheduling, which 0.11.0 refuses) are left out; ``harness/engines/vllm_compat.py`` follows
the renamed internals.  One change is left out because no stream can show it:
from 0.11.1 a running request's drafts are cleared once scheduled, but the
proposer hands every scheduled request its next drafts before they are read
again, so the cleared list is never seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: The releases whose rules the reference states, oldest first.
RELEASES = ("0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0",
            "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1",
            "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0",
            "0.25.0", "0.25.1")


@dataclass(frozen=True)
class RuleChange:
    name: str
    since: str  # first release with the new rule
    pr: str  # the vLLM pull request, or "" when not identified
    summary: str  # what the new rule says, against 0.11.0's
    until: str | None = None  # first release that went back to 0.11.0's rule

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
        "quirks.PRIORITY_VICTIM_KEEPS_ITS_GRANT.)"),
    RuleChange(
        "stop_tokens_before_length", "0.11.1", "",
        "The stop check looks at EOS and the stop tokens before the length caps, so a "
        "request whose last allowed token is EOS or a stop token finishes "
        "FINISHED_STOPPED, not FINISHED_LENGTH_CAPPED."),
    RuleChange(
        "running_tokens_capped_by_max_tokens", "0.11.1", "#27922",
        "A running request computes at most up to prompt + max_tokens - 1 positions "
        "(as well as max_model_len - 1), so drafts that reach past the request's last "
        "output are not scheduled.", until="0.12.0"),
    RuleChange(
        "threshold_dropped_when_nothing_chunks", "0.11.1", "",
        "At start-up, with chunked prefill off and prefix caching not asked for, the "
        "long-prefill token threshold is set to 0 (no cap).", until="0.12.0"),
    RuleChange(
        "chunked_off_stops_at_first_misfit", "0.12.0", "#28911",
        "With chunked prefill off, admission stops at the first waiting request whose "
        "whole prompt does not fit the step's remaining budget, instead of setting it "
        "aside and trying the requests behind it.  (0.11.0 set such requests aside: "
        "quirks.SKIPPED_WAITING_REQUESTS_REVERSED.)"),
    RuleChange(
        "chunked_local_frees_last_cached_page", "0.11.1", "#25431",
        "A chunked-local-attention group gives back every page before the chunk of the "
        "next token, the request's last cached page too (0.11.0 keeps that one; the "
        "pages to skip now come from get_num_skipped_tokens).  Found by hybrid streams "
        "on the 0.11.1 side environment."),
    RuleChange(
        "grammar_rows_in_grant_order", "0.11.1", "",
        "Structured output: the constrained requests' bitmask rows follow the order tokens "
        "were granted in (num_scheduled_tokens: running requests first, then admissions), "
        "and a request's index counts constrained requests only.  (0.11.0 follows the "
        "worker's batch, new then running then resumed, and indexes the whole batch.)  "
        "The engine now asks for the bitmask after schedule() (get_grammar_bitmask)."),
    RuleChange(
        "prefix_stats_split_preempted", "0.11.1", "",
        "Scheduler stats: the prefix-cache lookups of a request preempted before are "
        "counted apart (preempted_requests, preempted_queries, preempted_hits) and no "
        "longer in requests, queries and hits.  Found by the stats streams on the 0.11.1 "
        "side environment."),
    RuleChange(
        "kv_events_name_the_adapter", "0.11.1", "#27728",
        "KV cache events: a BlockStored for a request with a LoRA adapter names the "
        "adapter's integer id.  (0.11.0 asks the adapter for an ``id`` it does not have "
        "and the engine raises AttributeError: quirks.KV_EVENTS_FAIL_WITH_LORA.)  Found by "
        "the first KV-event streams on 0.11.0."),
    RuleChange(
        "eagle_encoder_one_token_ahead", "0.12.0", "",
        "Multimodal inputs with an eagle drafter: the drafter reads one position past "
        "the granted range, so a placeholder that starts right after the range needs its "
        "encoder output (or its cached output) this step, and an item that cannot be "
        "encoded now cuts the grant one token earlier (to nothing when the request has "
        "computed up to one token before it).  The whole-item cut of "
        "disable_chunked_mm_input is not shifted.  Found by the 0.12.0 upgrade check."),
    RuleChange(
        "eagle_lookahead_item_waits", "0.13.0", "#30475",
        "A placeholder needed only by the eagle drafter's look-ahead (it starts right "
        "after the granted range) is still looked up in the encoder cache and must fit "
        "the encoder budget and cache, but it is encoded only once the range reaches it: "
        "the scheduler now encodes an item only when the range holds some of its "
        "embeddings."),
    RuleChange(
        "abort_skips_finished_requests", "0.11.1", "",
        "An abort of a request that has finished but is still known to the scheduler "
        "(a KV connector is sending its pages) is ignored.  0.11.0 finished it again: its "
        "status became FINISHED_ABORTED, the connector's request_finished was called a "
        "second time and the worker was told of the finish again.  Found by the "
        "KV-connector streams of the 0.12.0 upgrade check; 0.11.1 has it already."),
    RuleChange(
        "kv_events_published_after_update", "0.11.1", "",
        "The KV cache events a step gathered are published at the end of "
        "update_from_output, no longer at the end of schedule.  A synchronous step "
        "schedules and updates, so it publishes the same batch; under async scheduling a "
        "step that applies no batch publishes nothing, and its events go out with the "
        "next step that applies one."),
    RuleChange(
        "async_skips_requests_at_max_tokens", "0.12.0", "",
        "Async scheduling: a running request whose output placeholders already take it to "
        "max_tokens (computed + 2 - placeholders >= prompt + max_tokens) is passed over, "
        "so the extra position 0.11.0 schedules after a request's last token is no longer "
        "scheduled (the request is not known to have stopped when the next batch is "
        "scheduled, but it cannot need another token)."),
    RuleChange(
        "set_aside_order_kept", "0.14.0", "",
        "Under fcfs, the requests set aside in a step come back to the head of the waiting "
        "queue in the order they were set aside: the queue now reverses them as it puts them "
        "back, undoing the reversal of quirks.SKIPPED_WAITING_REQUESTS_REVERSED."),
    RuleChange(
        "window_hits_skipped_at_admission", "0.14.0", "",
        "A new request's prefix-hit pages that lie wholly before the window of its hit "
        "and loaded tokens (sliding window, chunked local attention) are not taken: null "
        "pages stand in their place and the pages stay where they are in the free queue "
        "(0.11.0 took them and gave them back at the next step, to the tail).  Pages are "
        "counted per group with a floor of zero, and only the hit pages inside the window "
        "count as taken from the free queue."),
    RuleChange(
        "window_pages_freed_before_connector_finish", "0.14.0", "",
        "Before the KV connector hears that a request finished (request_finished), the "
        "pages out of the window of all its tokens are given back and show as null pages "
        "in the block ids it is handed."),
    RuleChange(
        "null_pages_never_cached", "0.14.0", "",
        "Caching full pages passes over null pages, so a sliding-window page that left "
        "the window before it was cached is never indexed (quirks.NULL_PAGE_CACHED is "
        "gone).  A BlockStored event lists the hashes of the pages really indexed, and its "
        "parent is the request's hash of the page before, whatever page stands there."),
    RuleChange(
        "connector_told_whole_table", "0.14.0", "",
        "After an allocation the KV connector is told every page of the request's table "
        "(get_blocks), not only its prefix-hit pages and the pages just added, so a request "
        "whose asynchronous load is done hears of its loaded pages again when it is "
        "admitted."),
    RuleChange(
        "loaded_preempted_request_resumes", "0.14.0", "#31583",
        "A request preempted earlier whose asynchronous KV load is reported done goes back "
        "to PREEMPTED, no longer to WAITING, so it is admitted as a resumed request; while "
        "it cannot be admitted (no pages, no room for its whole sequence, ...) it shows as "
        "PREEMPTED.  Found by the 5,000-stream 0.19.0 upgrade check."),
    RuleChange(
        "failed_admission_lets_go_of_encoder_inputs", "0.14.0", "#31857",
        "A waiting request turned away because its pages cannot be allocated (from 0.19.0 "
        "also because its whole sequence would not fit) lets go of the encoder-cache "
        "entries its lookup found, so they can be evicted for other items; 0.11.0 kept "
        "them held by it until it was admitted or finished.  Found by the 5,000-stream "
        "0.19.0 upgrade check."),
    RuleChange(
        "aborted_load_keeps_pages_until_done", "0.16.0", "#32255",
        "A request aborted while its asynchronous KV load runs (not yet reported done) "
        "keeps its pages until the worker reports the load done; they are freed then, after "
        "the step's other frees.  An abort after the load was reported done frees them at "
        "once, as 0.11.0 always did.  When the connector also keeps the pages to send them, "
        "the later of the two reports names a request no longer known and the engine raises "
        "AssertionError (quirks.ABORTED_LOAD_REPORTED_TWICE).  Found by the 5,000-stream "
        "0.19.0 upgrade check."),
    RuleChange(
        "eagle_whole_item_cut_one_token_earlier", "0.17.0", "#34220",
        "With disable_chunked_mm_input and an eagle drafter, a grant that would end inside a "
        "placeholder it enters from before is cut one token before the placeholder (to "
        "nothing at the least), as the encoder-budget cut already was, so the drafter's read "
        "one position ahead stays out of it.  Found by the 5,000-stream 0.19.0 upgrade "
        "check."),
    RuleChange(
        "grammar_rows_skip_prefill_chunks", "0.17.0", "",
        "Structured output: a constrained request whose step leaves part of its known "
        "tokens uncomputed (a prefill chunk: it samples nothing) gets no bitmask row and no "
        "index; only requests that sample this step are listed."),
    RuleChange(
        "set_aside_requests_wait_apart", "0.18.0", "",
        "Requests set aside in a step (waiting for a grammar or a KV load, turned away by "
        "the LoRA slots, not fitting whole with chunked prefill off, ...) and new requests "
        "that cannot run yet (grammar not ready) wait in a second queue "
        "(skipped_waiting) instead of going back to the head of the waiting queue.  Under "
        "fcfs that queue is served first; under priority the better of the two heads is "
        "taken.  So a request preempted after others were set aside now comes after them."),
    RuleChange(
        "async_load_counts_tokens_at_once", "0.18.0", "",
        "A request whose KV cache loads asynchronously counts its hit and loaded tokens as "
        "computed from the step the load starts (0.11.0: zero until the load is done).  "
        "Once done it keeps that count (less the last token when it covers every token), "
        "and its pages are cached for the whole count, not for every token its pages "
        "cover."),
    RuleChange(
        "admission_reserves_whole_sequence", "0.19.0", "#37307",
        "A waiting request is admitted only when the free pages would hold all its tokens "
        "(capped at max_model_len) beyond its prefix hit, not only the tokens of its first "
        "chunk; when they would not, the waiting part of the step ends.  vLLM's "
        "scheduler_reserve_full_isl, on by default.  A prompt longer than the whole pool is "
        "therefore never admitted."),
    RuleChange(
        "mm_hash_keys_carry_the_offset", "0.19.0", "",
        "A multimodal item enters a block's key as its content hash and its offset from the "
        "block's start, and an item that ends exactly where a block starts no longer touches "
        "that block (half of quirks.MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING is gone; a later "
        "hashing still looks at the last item only)."),
    RuleChange(
        "waiting_stats_count_set_aside_apart", "0.20.0", "",
        "Scheduler stats: num_waiting_reqs counts the waiting queue only; the requests "
        "waiting in the set-aside queue (skipped_waiting) are counted apart, in "
        "num_skipped_waiting_reqs."),
    RuleChange(
        "connector_finish_window_of_computed_tokens", "0.20.0", "",
        "The pages given back before the connector hears of a finish are those out of the "
        "window of the request's computed tokens, no longer of all its tokens (so the page "
        "of its last, uncomputed token's window start is kept)."),
    RuleChange(
        "admission_reserves_lookahead", "0.23.0", "#43733",
        "A waiting request admitted with a drafter that reads ahead (eagle) gets its "
        "lookahead slots at once, a new request too (0.11.0 reserved them only for a request "
        "that had computed tokens, a resumed one); only a request whose KV cache loads "
        "asynchronously gets none."),
    RuleChange(
        "uncached_pages_reused_first", "0.23.0", "#43447",
        "Pages a sliding-window, chunked-local or Mamba group gives back while the request "
        "runs, and a sliding-window group's pages when the request finishes or is "
        "preempted, go to the head of the free queue when they hold no cached prefix (they "
        "are reused first, the last page freed first); cached ones join the tail as "
        "before."),
    RuleChange(
        "window_of_one_indexes_nothing", "0.23.0", "#43447",
        "A sliding window of one token (the token itself), with no eagle drafter, indexes "
        "none of its full pages in the prefix cache, since no hit could ever need an "
        "earlier page of that group; such a group, and so the whole hybrid request, never "
        "hits, and its pages are reused first when given back."),
    RuleChange(
        "kv_pages_first_in_tensor", "0.23.0", "",
        "KV sizing: the flash-attention backend's per-layer KV tensor puts the pages first "
        "(num_blocks, 2, block_size, heads, head size); 0.11.0 put K/V first.  The pool's "
        "pages and bytes are unchanged."),
    RuleChange(
        "every_uncached_page_reused_first", "0.24.0", "",
        "Every page given back (a finished or preempted request's, of any group) goes to "
        "the head of the free queue when it holds no cached prefix, in the order given, so "
        "it is reused before any cached page is evicted; cached pages join the tail as "
        "before.  0.23.0 did this for sliding-window, chunked-local and Mamba pages only."),
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
