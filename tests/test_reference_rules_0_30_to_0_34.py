"""Unit tests of the rule changes of vLLM 0.30.0 to 0.34.0 in the reference (no vLLM needed).

Each test runs one situation under the rules just before a change and with it."""

from __future__ import annotations

from reference import releases
from reference.block_hash import HashInputs, extend_block_hashes
from reference.config import Config
from reference.encoder_cache import EncoderInput
from reference.request import Request, RequestStatus
from reference.scheduler import Scheduler
from reference.structured_output import Grammar


def config(rules: frozenset[str], **kw) -> Config:
    base = dict(block_size=4, num_blocks=16, max_num_batched_tokens=64, max_num_seqs=4,
                max_model_len=64, rules=rules)
    base.update(kw)
    return Config(**base)


def request(rid: str, prompt, arrival: float = 0.0, **kw) -> Request:
    return Request(request_id=rid, prompt_token_ids=list(prompt),
                   max_tokens=kw.pop("max_tokens", 4), arrival_time=arrival, hash_block_size=4,
                   **kw)


def step(s: Scheduler):
    out = s.schedule()
    s.update_from_output(out, {rid: [7] for rid in out.num_scheduled_tokens})
    return out


def without(release: str, change: str) -> frozenset[str]:
    return releases.rules_of(release) - {change}


def test_a_hit_request_is_padded_without_running_requests_from_0_30_0():
    """padding_without_running_requests: r2 hits 4 of its 5 tokens in a step with no running
    request; 0.29.0 grants its one token, 0.30.0 pads it to 1 + 2 with placeholder drafts."""
    change = "padding_without_running_requests"
    for rules, granted, drafts in ((without("0.30.0", change), 1, {}),
                                   (releases.rules_of("0.30.0"), 3, {"r2": [-1, -1]})):
        s = Scheduler(config(rules, num_speculative_tokens=2))
        s.add_request(request("r1", [1, 2, 3, 4, 5], max_tokens=1))
        step(s)  # r1 finishes, its first page cached
        s.add_request(request("r2", [1, 2, 3, 4, 6], arrival=1.0, max_tokens=4))
        out = s.schedule()
        assert out.num_scheduled_tokens == {"r2": granted}, rules
        assert out.scheduled_spec_decode_tokens == drafts


def test_a_request_with_nothing_computed_still_needs_a_running_request():
    s = Scheduler(config(releases.rules_of("0.30.0"), num_speculative_tokens=2))
    s.add_request(request("r", [5], max_tokens=4))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r": 1} and out.scheduled_spec_decode_tokens == {}


def test_the_threshold_caps_nothing_for_a_lone_request_from_0_31_0():
    """threshold_lifted_for_a_lone_request: one unfinished request computes its whole
    prompt; with a second one waiting both are capped again."""
    change = "threshold_lifted_for_a_lone_request"
    for rules, lone in ((without("0.31.0", change), 3), (releases.rules_of("0.31.0"), 8)):
        s = Scheduler(config(rules, long_prefill_token_threshold=3))
        s.add_request(request("A", range(1, 9)))
        assert s.schedule().num_scheduled_tokens == {"A": lone}, rules
        s = Scheduler(config(rules, long_prefill_token_threshold=3))
        s.add_request(request("A", range(1, 9)))
        s.add_request(request("B", range(11, 19), arrival=1.0))
        assert s.schedule().num_scheduled_tokens == {"A": 3, "B": 3}, rules


class Connector:
    def __init__(self, answer):
        self.answer = answer
        self.calls: list[tuple] = []

    def get_num_new_matched_tokens(self, request, num_local_hit):
        self.calls.append(("lookup", request.request_id, num_local_hit, self.answer))
        return self.answer

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        self.calls.append(("alloc", request.request_id, list(block_ids), num_external_tokens))

    def request_finished(self, request, block_ids):
        return False


def test_a_request_reading_no_prefix_loads_nothing_from_outside_from_0_31_0():
    """external_hit_ignored_without_prefix_reads: with prompt logprobs, the connector's
    asynchronous hit of 4 tokens is asked for but not taken: the prompt is computed now."""
    change = "external_hit_ignored_without_prefix_reads"
    for rules, status, scheduled, external in (
            (without("0.31.0", change), RequestStatus.WAITING_FOR_REMOTE_KVS, {}, 4),
            (releases.rules_of("0.31.0"), RequestStatus.RUNNING, {"r": 6}, 0)):
        c = Connector((4, True))
        s = Scheduler(config(rules), connector=c)
        s.add_request(request("r", range(1, 7), wants_prompt_logprobs=True))
        out = s.schedule()
        assert out.num_scheduled_tokens == scheduled, rules
        assert s.requests["r"].status == status
        assert c.calls[0] == ("lookup", "r", 0, (4, True))
        assert c.calls[1][3] == external
    # Nor does it wait when the connector cannot tell yet.
    s = Scheduler(config(releases.rules_of("0.31.0")), connector=Connector((None, False)))
    s.add_request(request("r", range(1, 7), wants_prompt_logprobs=True))
    assert s.schedule().num_scheduled_tokens == {"r": 6}


def test_an_async_load_keeps_a_draft_step_free_from_0_31_0_counted_per_sequence_from_0_32_0():
    """async_load_reserves_a_draft_step, draft_step_counted_in_each_group: a (20 tokens,
    chunked to 8) holds 1 of the 4 usable 16-token pages; b's load needs 1 of the 3 free.
    With 2 draft tokens a draft step is 3 slots, 1 page: 0.30.0 keeps a's 1 page, 0.31.0
    1 + (1 + 1) pages, 0.32.0 1 + (23 tokens: 2 pages less the 1 held)."""
    for release, loads in (("0.30.0", True), ("0.31.0", False), ("0.32.0", True)):
        s = Scheduler(config(releases.rules_of(release), block_size=16, num_blocks=5,
                             long_prefill_token_threshold=8, num_speculative_tokens=2),
                      connector=Connector((4, True)))
        s.add_request(request("a", range(1, 21)))
        s.add_request(request("b", range(31, 36), arrival=1.0))
        s.schedule()
        assert (s.requests["b"].status == RequestStatus.WAITING_FOR_REMOTE_KVS) == loads, release
    s = Scheduler(config(releases.rules_of("0.31.0"), block_size=16, num_blocks=5,
                         long_prefill_token_threshold=8), connector=Connector((4, True)))
    assert s.draft_step_pages() == 0  # nothing kept without drafting


def test_the_whole_item_cut_comes_before_the_lookups_from_0_32_0():
    """whole_item_cut_before_lookups: the second item has the first one's hash; a grant of
    6 stops inside it.  Up to 0.31.0 it is passed over as encoded already; from 0.32.0 it
    cuts the grant to 5 (the drafter's token before it)."""
    from reference.encoder_cache import EncoderCacheManager
    from reference.encoder_inputs import try_schedule_encoder_inputs
    r = request("r", [0] * 9, encoder_inputs=(EncoderInput(2, 3, "img"), EncoderInput(6, 3, "img")))
    for first, granted in ((False, 6), (True, 5)):
        assert try_schedule_encoder_inputs(
            r, 0, 6, 16, EncoderCacheManager(16), disable_chunked_mm_input=True, lookahead=1,
            whole_item_lookahead=1, whole_item_first=first) == ([0], granted, 13), first


def test_a_later_hashing_sees_every_item_from_0_31_0():
    """later_hashing_sees_every_item: two one-token items at 8 and 9 in a page of 4 that
    outputs complete get the same key as when a longer prompt completes it at once."""
    items = (EncoderInput(8, 1, "cat"), EncoderInput(9, 1, "dog"))
    prompt, outputs = [1, 2, 3, 4, 5, 6, 7, 8, 0, 0], [7, 8]
    for every_item, same in ((False, False), (True, True)):
        inputs = HashInputs(encoder_inputs=items, mm_keys_with_offset=True,
                            later_hashing_sees_every_item=every_item)
        later: list[bytes] = []
        extend_block_hashes(later, prompt, 4, inputs)
        extend_block_hashes(later, prompt + outputs, 4, inputs)
        at_once: list[bytes] = []
        extend_block_hashes(at_once, prompt + outputs, 4, inputs)
        assert later[:2] == at_once[:2]
        assert (later[2] == at_once[2]) is same


def test_the_scheduler_asks_for_every_item_from_0_31_0():
    """For a request with items; one without has nothing for the rule to see."""
    for release, flag in (("0.30.0", False), ("0.31.0", True)):
        s = Scheduler(config(releases.rules_of(release)))
        r = request("r", [1, 2, 3], encoder_inputs=(EncoderInput(1, 2, "img"),))
        s.add_request(r)
        assert r.hash_inputs.later_hashing_sees_every_item is flag
        plain = request("p", [1, 2])
        s.add_request(plain)
        assert plain.hash_inputs.later_hashing_sees_every_item is False


def test_a_request_set_aside_waits_in_arrival_order_again_from_0_31_0():
    """page_holders_wait_first: b, whose grammar was not ready when it arrived, waited apart
    and was served first from 0.18.0; from 0.31.0 it waits behind a, which came first."""
    for release, first in (("0.30.0", "b"), ("0.31.0", "a")):
        s = Scheduler(config(releases.rules_of(release), max_num_seqs=1))
        s.add_request(request("r", [1, 2, 3], max_tokens=2))
        step(s)
        s.add_request(request("a", [11, 12], arrival=1.0))
        grammar = Grammar()
        s.add_request(request("b", [21, 22], arrival=2.0, grammar=grammar))
        grammar.ready = True
        step(s)  # r finishes
        assert list(step(s).num_scheduled_tokens) == [first], release


def test_requests_holding_pages_wait_first_from_0_31_0():
    """page_holders_wait_first: a request whose asynchronous load is under way waits in a
    queue served before the waiting queue; the set-aside requests count apart in the stats
    until admitted."""
    rules = releases.rules_of("0.31.0")
    c = Connector((4, True))
    s = Scheduler(config(rules, max_num_seqs=4), connector=c)
    s.add_request(request("h", range(1, 7)))
    out = s.schedule()
    stats = s.update_from_output(out, {})
    assert s.requests["h"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert list(s.set_aside_queue) == [s.requests["h"]] and len(s.waiting) == 0
    assert (stats.num_waiting_reqs, stats.num_set_aside) == (0, 1)
    c.answer = (0, False)
    grammar = Grammar()
    s.add_request(request("g", [31, 32], arrival=1.0, grammar=grammar))
    s.add_request(request("w", [41, 42], arrival=2.0))
    out = s.schedule()
    stats = s.update_from_output(out, {"w": [7]})
    assert out.num_scheduled_tokens == {"w": 2}
    assert [r.request_id for r in s.waiting] == ["g"]
    assert (stats.num_waiting_reqs, stats.num_set_aside) == (0, 2)  # g and h, set aside


def test_lora_slots_are_held_by_every_running_request_from_0_33_0():
    """lora_slots_held_by_every_running_request: a running request that gets no token this
    step still holds its adapter's slot (up to 0.32.0 only the scheduled ones did)."""
    from reference.lora import AdapterSlots
    from reference.scheduler import StepPlan
    change = "lora_slots_held_by_every_running_request"
    for rules, turned_away in ((without("0.33.0", change), False),
                               (releases.rules_of("0.33.0"), True)):
        s = Scheduler(config(rules, max_loras=1))
        s.running.append(request("a", [1], lora_id=1))  # running, not scheduled yet
        slots = AdapterSlots(1, s.adapter_holders(StepPlan(token_budget=8)))
        assert slots.turns_away(request("c", [2], lora_id=2)) is turned_away, rules


def test_a_self_preempted_priority_request_lets_the_others_run_from_0_33_0():
    """priority_self_preemption_goes_on: the least urgent running request preempts itself;
    the more urgent one behind it in the running list still runs in the pages it freed."""
    change = "priority_self_preemption_goes_on"
    for rules, scheduled in ((without("0.33.0", change), {}),
                             (releases.rules_of("0.33.0"), {"urgent": 1})):
        s = Scheduler(config(rules, policy="priority", num_blocks=3, enable_prefix_caching=False))
        s.add_request(request("lazy", [1, 2, 3, 4], priority=5, max_tokens=8))
        s.add_request(request("urgent", [5, 6, 7], arrival=1.0, priority=0, max_tokens=8))
        step(s)  # a page each: lazy is full, urgent has room for one more token
        s.running.sort(key=lambda r: r.priority, reverse=True)  # lazy first
        out = s.schedule()
        assert s.requests["lazy"].status == RequestStatus.PREEMPTED, rules
        assert out.num_scheduled_tokens == scheduled, rules


def test_a_stop_leaves_dropped_tokens_uncomputed_from_0_33_0():
    """outputs_update_the_cache_at_once: A's two drafts are accepted and the first is its
    stop token; the computed count no longer holds the two tokens dropped after it."""
    change = "outputs_update_the_cache_at_once"
    for rules, computed in ((without("0.33.0", change), 6), (releases.rules_of("0.33.0"), 4)):
        s = Scheduler(config(rules, num_speculative_tokens=2))
        s.add_request(request("A", [1, 2, 3], stop_token_ids=(9,), max_tokens=8))
        s.update_from_output(s.schedule(), {"A": [4]})
        s.update_draft_token_ids({"A": [9, 8]})
        out = s.schedule()
        a = s.requests["A"]
        s.update_from_output(out, {"A": [9, 8, 5]})  # both accepted; 9 stops it
        assert a.is_finished and a.num_computed_tokens == computed, rules


def test_pages_filled_by_accepted_drafts_are_cached_at_once_from_0_33_0():
    """outputs_update_the_cache_at_once: the accepted drafts fill A's second page and A
    stops; the page is cached before it is freed, so B hits it (up to 0.32.0 it would have
    been cached at A's next allocation, which never came)."""
    change = "outputs_update_the_cache_at_once"
    for rules, hit in ((without("0.33.0", change), 4), (releases.rules_of("0.33.0"), 8)):
        s = Scheduler(config(rules, num_speculative_tokens=2))
        s.add_request(request("A", [1, 2, 3, 4, 5], stop_token_ids=(9,), max_tokens=8))
        s.update_from_output(s.schedule(), {"A": [6]})
        s.update_draft_token_ids({"A": [7, 8]})
        s.update_from_output(s.schedule(), {"A": [7, 8, 9]})  # accepted; 9 stops it
        assert s.requests == {}
        s.add_request(request("B", [1, 2, 3, 4, 5, 6, 7, 8, 20], arrival=1.0))
        out = s.schedule()
        assert out.scheduled_new_reqs[0].num_computed_tokens == hit, rules


def test_eagle_keys_cover_the_next_token_from_0_33_0():
    """eagle_hashes_cover_the_next_token: a block is keyed once the token after it is known,
    its key holds that token, and the eagle hit keeps its last block."""
    change = "eagle_hashes_cover_the_next_token"
    for rules, hit in ((without("0.33.0", change), 4), (releases.rules_of("0.33.0"), 8)):
        s = Scheduler(config(rules, num_speculative_tokens=1, use_eagle=True))
        s.add_request(request("A", range(1, 11), max_tokens=1))
        step(s)
        b = request("B", list(range(1, 10)) + [20], arrival=1.0)
        s.add_request(b)
        assert len(b.block_hashes) == 2
        out = s.schedule()
        assert out.scheduled_new_reqs[0].num_computed_tokens == hit, rules
    s = Scheduler(config(releases.rules_of("0.33.0"), num_speculative_tokens=1, use_eagle=True))
    c = request("C", range(1, 9))
    s.add_request(c)
    assert len(c.block_hashes) == 1  # the second block waits for its next token
    d = request("D", list(range(1, 5)) + [7, 6, 7, 8, 9])
    s.add_request(d)
    assert d.block_hashes[0] != c.block_hashes[0]  # same block, another next token


def test_the_threshold_needs_chunked_prefill_from_0_34_0():
    change = "threshold_needs_chunked_prefill"
    for rules, granted in ((without("0.34.0", change), 3), (releases.rules_of("0.34.0"), 8)):
        s = Scheduler(config(rules, long_prefill_token_threshold=3,
                             enable_chunked_prefill=False))
        s.add_request(request("A", range(1, 9)))
        s.add_request(request("B", range(11, 19), arrival=1.0))
        assert s.schedule().num_scheduled_tokens["A"] == granted, rules


def test_an_item_that_cannot_run_cuts_the_grant_right_before_it_from_0_33_0():
    """encoder_cuts_at_the_item: with an eagle drafter (lookahead 1) an item at 7 that does
    not fit the encoder budget cut a 7-token grant to 6 up to 0.32.0; from 0.33.0 the
    grant ends right before the item, 7 tokens, and an item further in cuts it there."""
    from reference.encoder_cache import EncoderCacheManager
    from reference.encoder_inputs import try_schedule_encoder_inputs
    r = request("r", [1] * 12, encoder_inputs=(EncoderInput(2, 4, "fox"), EncoderInput(7, 5, "owl")))
    for cut_at_item, granted in ((False, 6), (True, 7)):
        cache = EncoderCacheManager(16)
        assert try_schedule_encoder_inputs(r, 0, 7, 8, cache, lookahead=1,
                                           cut_at_item=cut_at_item) == ([0], granted, 4)
    cache = EncoderCacheManager(16)
    assert try_schedule_encoder_inputs(r, 0, 12, 8, cache, lookahead=1, cut_at_item=True) \
        == ([0], 7, 4)


def test_the_whole_item_cut_protects_a_placeholder_the_range_starts_at_from_0_33_0():
    from reference.encoder_cache import EncoderCacheManager
    from reference.encoder_inputs import try_schedule_encoder_inputs
    r = request("r", [1] * 12, encoder_inputs=(EncoderInput(4, 6, "fox"),))
    for cut_at_item, granted in ((False, 3), (True, 0)):
        cache = EncoderCacheManager(16)
        encode, num_new, _ = try_schedule_encoder_inputs(
            r, 4, 3, 16, cache, disable_chunked_mm_input=True, cut_at_item=cut_at_item)
        assert num_new == granted, cut_at_item


def test_a_request_the_encoder_cuts_to_nothing_is_set_aside_from_0_33_0():
    """encoder_cut_sets_aside: a's image does not fit the encoder budget at all this step;
    up to 0.32.0 the waiting part ended there, from 0.33.0 b behind it runs."""
    change = "encoder_cut_sets_aside"
    for rules, scheduled in ((without("0.33.0", change), {}),
                             (releases.rules_of("0.33.0"), {"b": 3})):
        s = Scheduler(config(rules, encoder_compute_budget=4,
                             max_tokens_by_modality=(("image", 8),)))
        s.add_request(request("a", [0] * 8, encoder_inputs=(EncoderInput(0, 8, "cat"),)))
        s.add_request(request("b", [1, 2, 3], arrival=1.0))
        s.encoder_compute_budget = 4  # below the largest item: nothing of a can run
        assert s.schedule().num_scheduled_tokens == scheduled, rules


def test_an_unchunked_prompt_is_not_split_by_the_encoder_from_0_34_0():
    """unchunked_mm_prompt_not_split: chunked prefill off, a's second image does not fit the
    encoder cache; up to 0.33.0 a computes the 4 tokens before it, from 0.34.0 nothing (b
    behind it runs in both)."""
    change = "unchunked_mm_prompt_not_split"
    for rules, scheduled in ((without("0.34.0", change), {"a": 4, "b": 3}),
                             (releases.rules_of("0.34.0"), {"b": 3})):
        s = Scheduler(config(rules, enable_chunked_prefill=False, encoder_cache_size=6,
                             max_tokens_by_modality=(("image", 4),)))
        s.add_request(request("a", [0] * 12, encoder_inputs=(EncoderInput(0, 4, "cat"),
                                                           EncoderInput(4, 4, "dog"))))
        s.add_request(request("b", [1, 2, 3], arrival=1.0))
        out = s.schedule()
        assert {k: v for k, v in out.num_scheduled_tokens.items()} == scheduled, rules


def test_the_first_rejected_draft_stays_and_its_rows_are_unfilled_from_0_34_0():
    """grammar_keeps_first_invalid_draft: drafts [6, 9, 7] under a grammar rejecting 9 are
    cut to [6] up to 0.33.0, to [6, 9] from 0.34.0, whose rows after 9 are unfilled."""
    change = "grammar_keeps_first_invalid_draft"
    for rules, drafts, rows in ((without("0.34.0", change), [6], [0, 1]),
                                (releases.rules_of("0.34.0"), [6, 9], [0, 1, -1])):
        s = Scheduler(config(rules, num_speculative_tokens=3))
        grammar = Grammar(rejected=frozenset({9}), ready=True)
        s.add_request(request("a", [1, 2, 3], grammar=grammar))
        s.update_from_output(s.schedule(), {"a": [5]})
        s.update_draft_token_ids({"a": [6, 9, 7]})
        out = s.schedule()
        assert out.scheduled_spec_decode_tokens == {"a": drafts}, rules
        assert [row.grammar_state - grammar.num_accepted if row.grammar_state >= 0 else -1
                for row in out.grammar.rows] == rows, rules


def test_the_last_row_after_a_placeholder_is_left_unfilled_from_0_30_0():
    """placeholder_leaves_last_row_unfilled: drafts [5, -1, -1] give rows in states 0 and 1
    (the placeholder's own row), two unfilled, and the sampled token's row: in state 1 up
    to 0.29.0, unfilled from 0.30.0.  Without a placeholder the last row is filled."""
    from types import SimpleNamespace

    from reference.structured_output import UNFILLED_ROW, rows_of

    def states(drafts, last_row_after_placeholder):
        request = SimpleNamespace(request_id="r", grammar=Grammar(ready=True))
        rows = rows_of(request, drafts, last_row_after_placeholder=last_row_after_placeholder)
        assert request.grammar.num_accepted == 0  # rolled back
        return [row.grammar_state for row in rows]

    assert states([5, -1, -1], True) == [0, 1, UNFILLED_ROW, 1]
    assert states([5, -1, -1], False) == [0, 1, UNFILLED_ROW, UNFILLED_ROW]
    assert states([5, 6], False) == [0, 1, 2]


def test_an_encoder_output_is_held_one_token_longer_for_an_eagle_drafter_0_24_to_0_32():
    """encoder_outputs_held_for_the_drafter: an item at tokens 2-4 is let go once 5 tokens
    are computed; with the drafter's read-ahead held back, only at 6."""
    from types import SimpleNamespace

    from reference.encoder_cache import EncoderCacheManager
    from reference.encoder_inputs import free_encoder_inputs

    for lookahead, still_held_at_5 in ((0, False), (1, True)):
        cache = EncoderCacheManager(8)
        request = SimpleNamespace(request_id="r", encoder_inputs=(EncoderInput(2, 3, "img"),))
        cache.allocate(request, 0)
        free_encoder_inputs(request, 5, cache, drafter_lookahead=lookahead)
        assert (cache.holders["img"] == {"r"}) is still_held_at_5
        free_encoder_inputs(request, 6, cache, drafter_lookahead=lookahead)
        assert cache.holders["img"] == set()  # freeable: another item may evict it
    assert "encoder_outputs_held_for_the_drafter" in releases.rules_of("0.32.0")
    assert "encoder_outputs_held_for_the_drafter" not in releases.rules_of("0.23.0")
    assert "encoder_outputs_held_for_the_drafter" not in releases.rules_of("0.33.0")


def test_requests_that_fail_together_are_finished_in_arrival_order():
    """encoder_length_mismatch_fails_request: b (arrived second, found first) and a fail in
    one step; a's pages go back to the free queue before b's, whatever order they were
    found in (vLLM's own order is the per-process hash order of a set; the harness fixes
    arrival order, harness/engines/vllm_adapter.finish_in_arrival_order)."""
    s = Scheduler(config(releases.rules_of("0.34.0")))
    s.add_request(request("a", [1] * 8, max_tokens=4))
    s.add_request(request("b", [2] * 8, arrival=1.0, max_tokens=4))
    step(s)
    pages = {rid: [b.block_id for b in s.kv.coordinator.managers[0].req_to_blocks[rid]]
             for rid in ("a", "b")}
    s.encoder_mismatched.extend(["b", "a"])
    s.fail_mismatched_requests()
    assert s.requests["a"].status == s.requests["b"].status == RequestStatus.FINISHED_ERROR \
        if "a" in s.requests else set(s.requests).isdisjoint({"a", "b"})
    freed_last = s.kv.pool.free_queue.block_ids()[-4:]
    assert freed_last == list(reversed(pages["a"])) + list(reversed(pages["b"]))
