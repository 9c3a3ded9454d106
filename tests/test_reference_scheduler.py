"""Unit tests of the reference scheduler (no vLLM needed)."""

from __future__ import annotations

from reference.config import Config
from reference.request import Request, RequestStatus, check_stop
from reference.scheduler import Scheduler


def config(**kw) -> Config:
    base = dict(block_size=16, num_blocks=16, max_num_batched_tokens=64, max_num_seqs=4,
                max_model_len=128)
    base.update(kw)
    return Config(**base)


def request(rid: str, prompt, arrival: float = 0.0, **kw) -> Request:
    return Request(request_id=rid, prompt_token_ids=list(prompt), max_tokens=kw.pop("max_tokens", 16),
                   arrival_time=arrival, hash_block_size=16, **kw)


def step(s: Scheduler, tokens: dict[str, list[int]] | None = None):
    out = s.schedule()
    sampled = tokens or {rid: [7] for rid in out.num_scheduled_tokens}
    s.update_from_output(out, sampled)
    return out


def test_seed_example_schedules_4_then_1_then_1():
    s = Scheduler(config())
    s.add_request(request("A", [1, 2, 3, 4], eos_token_id=7))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"A": 4}
    assert out.scheduled_new_reqs[0].block_ids == [[1]]  # one list per KV cache group
    s.update_from_output(out, {"A": [5]})
    out = s.schedule()
    assert out.num_scheduled_tokens == {"A": 1}
    s.update_from_output(out, {"A": [6]})
    out = s.schedule()
    assert out.num_scheduled_tokens == {"A": 1}
    s.update_from_output(out, {"A": [7]})
    assert s.requests == {} and s.num_unfinished() == 0
    assert s.schedule().finished_req_ids == {"A"}  # reported on the next step


def test_budget_splits_a_prompt():
    s = Scheduler(config(max_num_batched_tokens=2, max_num_seqs=2, max_model_len=32, num_blocks=4))
    s.add_request(request("A", [1, 2, 3, 4]))
    assert s.schedule().num_scheduled_tokens == {"A": 2}
    assert s.schedule().num_scheduled_tokens == {"A": 2}


def test_fcfs_preempts_the_last_running_request():
    s = Scheduler(config(block_size=4, num_blocks=4, max_model_len=12, enable_prefix_caching=False))
    s.add_request(request("A", [1, 2, 3, 4], max_tokens=10))
    s.add_request(request("B", [5, 6, 7, 8], arrival=1, max_tokens=10))
    step(s)  # both prefills: pages 1 and 2
    out = step(s)  # both need a second page: only one is free after A takes it
    assert s.requests["B"].status == RequestStatus.PREEMPTED
    assert s.requests["B"].num_computed_tokens == 0
    assert list(out.num_scheduled_tokens) == ["A"]


def test_chunked_prefill_off_skips_too_long_requests_and_keeps_them_at_the_head():
    s = Scheduler(config(enable_chunked_prefill=False, max_num_batched_tokens=128))
    s.add_request(request("A", range(100)))
    s.add_request(request("B", range(200, 260), arrival=1))
    s.add_request(request("C", range(300, 310), arrival=2))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"A": 100, "C": 10}
    assert [r.request_id for r in s.waiting] == ["B"]


def test_stop_rules_in_order():
    r = request("A", [1, 2], max_tokens=2, eos_token_id=9, stop_token_ids=(8,))
    r.append_output_token(9)
    assert check_stop(r, 100) and r.status == RequestStatus.FINISHED_STOPPED
    r = request("B", [1, 2], max_tokens=1, eos_token_id=9)
    r.append_output_token(9)
    assert check_stop(r, 100) and r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    r = request("C", [1, 2], eos_token_id=9, ignore_eos=True, stop_token_ids=(8,))
    r.append_output_token(9)
    assert not check_stop(r, 100)
    r.append_output_token(8)
    assert check_stop(r, 100) and r.status == RequestStatus.FINISHED_STOPPED


def test_tokens_after_a_stop_token_are_dropped():
    s = Scheduler(config())
    s.add_request(request("A", [1, 2, 3], stop_token_ids=(5,)))
    s.requests["A"].spec_token_ids = []
    out = s.schedule()
    s.update_from_output(out, {"A": [4, 5, 6]})
    assert s.num_unfinished() == 0


def test_rejected_drafts_are_taken_back():
    s = Scheduler(config(num_speculative_tokens=3))
    s.add_request(request("A", [1, 2, 3, 4]))
    step(s, {"A": [5]})
    s.update_draft_token_ids({"A": [6, 9, 9]})
    out = s.schedule()
    assert out.num_scheduled_tokens == {"A": 4}
    assert out.scheduled_spec_decode_tokens == {"A": [6, 9, 9]}
    s.update_from_output(out, {"A": [6, 7]})  # one accepted, two rejected
    assert s.requests["A"].num_computed_tokens == 4 + 4 - 2


def test_abort_of_a_waiting_request_is_reported_next_step():
    s = Scheduler(config())
    s.add_request(request("A", [1, 2, 3]))
    s.finish_requests(["A"], RequestStatus.FINISHED_ABORTED)
    assert s.num_unfinished() == 0
    assert s.schedule().finished_req_ids == {"A"}


def test_a_lookup_is_counted_once_at_admission_from_0_27_0():
    """prefix_stats_counted_at_admission: B is looked up at every step it is refused pages;
    up to 0.26.0 each lookup counts, from 0.27.0 only the one of the step that admits it."""
    for rules, counted in ((frozenset(), [2, 1, 1]),
                           (frozenset({"prefix_stats_counted_at_admission"}), [1, 0, 1])):
        s = Scheduler(config(block_size=4, num_blocks=4, rules=rules))
        for rid, first, max_tokens in (("A", 1, 2), ("B", 11, 1)):  # 8 tokens: 2 of 3 pages
            s.add_request(Request(request_id=rid, prompt_token_ids=list(range(first, first + 8)),
                                  max_tokens=max_tokens, arrival_time=first, hash_block_size=4,
                                  eos_token_id=99))
        seen = []
        for _ in range(3):
            out = s.schedule()
            stats = s.update_from_output(out, {rid: [7] for rid in out.num_scheduled_tokens})
            seen.append(stats.prefix_cache.requests)
        assert seen == counted, rules


PAD = "new_decode_padded_with_drafts"
ROOM = "decode_padding_leaves_room_to_sample"


def test_a_one_token_admission_is_padded_with_drafts_from_0_25_0():
    """new_decode_padded_with_drafts, and from 0.29.0 decode_padding_leaves_room_to_sample:
    r2 hits 4 of its 5 tokens while r0 decodes; padded, it computes 1 + 1 draft of -1,
    unless (0.29.0) the token sampled after the padding would pass max_model_len (6)."""
    for rules, granted, drafts in ((frozenset(), 1, {}), (frozenset({PAD}), 2, {"r2": [-1]}),
                                   (frozenset({PAD, ROOM}), 1, {})):
        s = Scheduler(config(block_size=4, num_blocks=8, max_model_len=6,
                             num_speculative_tokens=1, rules=rules))
        for rid, prompt, max_tokens in (("r0", [9], 4), ("r1", [1, 2, 3, 4, 5], 1)):
            s.add_request(Request(request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens,
                                  arrival_time=0.0, hash_block_size=4))
        step(s)  # r1 finishes, its first page cached
        s.add_request(Request(request_id="r2", prompt_token_ids=[1, 2, 3, 4, 6], max_tokens=1,
                              arrival_time=1.0, hash_block_size=4))
        out = s.schedule()
        assert out.num_scheduled_tokens == {"r0": 1, "r2": granted}, rules
        assert out.scheduled_spec_decode_tokens == drafts, rules


def test_a_padded_grant_cut_by_the_threshold_raises_from_0_29_0():
    for rules, raises in ((frozenset({PAD}), False), (frozenset({PAD, ROOM}), True)):
        s = Scheduler(config(block_size=4, num_blocks=8, num_speculative_tokens=2,
                             long_prefill_token_threshold=2, rules=rules))
        s.add_request(Request(request_id="r0", prompt_token_ids=[9], max_tokens=4,
                              arrival_time=0.0, hash_block_size=4))
        step(s)
        s.add_request(Request(request_id="r2", prompt_token_ids=[5], max_tokens=1,
                              arrival_time=1.0, hash_block_size=4))
        try:
            out = s.schedule()
        except AssertionError:
            assert raises, rules
        else:
            assert not raises and out.num_scheduled_tokens["r2"] == 2, rules
            assert out.scheduled_spec_decode_tokens["r2"] == [-1, -1]


def test_a_placeholder_draft_stops_the_grammar_and_the_last_row_is_filled():
    """A padded request under a grammar: its placeholder's row and the row of the token
    sampled after it are both filled in the state reached (vLLM 0.25.0 and later)."""
    from reference.structured_output import Grammar
    rules = frozenset({PAD, "grammar_rows_in_grant_order"})
    s = Scheduler(config(block_size=4, num_blocks=8, num_speculative_tokens=2, rules=rules))
    s.add_request(Request(request_id="r0", prompt_token_ids=[9], max_tokens=4,
                          arrival_time=0.0, hash_block_size=4))
    step(s)
    s.add_request(Request(request_id="r2", prompt_token_ids=[5], max_tokens=2,
                          arrival_time=1.0, hash_block_size=4, grammar=Grammar(ready=True)))
    out = s.schedule()
    assert out.scheduled_spec_decode_tokens == {"r2": [-1, -1]}
    assert [(r.request_id, r.grammar_state) for r in out.grammar.rows] \
        == [("r2", 0), ("r2", -1), ("r2", 0)]


def test_a_passed_over_victim_steps_the_pass_back_from_0_28_0():
    """passed_over_victim_keeps_the_pass: v, passed over earlier in the step (no tokens),
    is the priority victim while x (index 1) asks for pages; from 0.28.0 the pass steps
    back with it, so y, which slides into index 1, is visited next."""
    from reference.scheduler import StepPlan
    for rules, index_after in ((frozenset({"priority_victim_loses_its_grant"}), 1),
                               (frozenset({"priority_victim_loses_its_grant",
                                           "passed_over_victim_keeps_the_pass"}), 0)):
        s = Scheduler(config(policy="priority", rules=rules))
        v, x, y = (Request(request_id=rid, prompt_token_ids=[1], max_tokens=4,
                           arrival_time=t, hash_block_size=16, priority=p)
                   for rid, t, p in (("v", 0.0, 2), ("x", 1.0, 0), ("y", 2.0, 1)))
        s.running = [v, x, y]
        plan = StepPlan(token_budget=64, running_index=1)
        assert s._pick_victim(plan) is v
        assert s.running == [x, y] and plan.running_index == index_after, rules
