"""Unit tests of the scheduler's side of a KV connector in the reference (no vLLM needed)."""

from __future__ import annotations

import pytest

from reference.config import Config
from reference.kv_connector import tokens_after_load
from reference.request import Request, RequestStatus
from reference.scheduler import Scheduler


class Connector:
    """Answers from a table; remembers the calls."""

    def __init__(self, answers: dict[str, list], keep: frozenset[str] = frozenset()):
        self.answers = answers
        self.keep = keep
        self.calls: list[tuple] = []

    def get_num_new_matched_tokens(self, request, num_local_hit):
        queue = self.answers.get(request.request_id, [])
        answer = queue.pop(0) if len(queue) > 1 else (queue[0] if queue else (0, False))
        self.calls.append(("lookup", request.request_id, num_local_hit, answer))
        return answer

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        self.calls.append(("alloc", request.request_id, list(block_ids), num_external_tokens))

    def request_finished(self, request, block_ids):
        self.calls.append(("finished", request.request_id, list(block_ids)))
        return request.request_id in self.keep


def scheduler(connector: Connector, **kw) -> Scheduler:
    base = dict(block_size=4, num_blocks=16, max_num_batched_tokens=64, max_num_seqs=4,
                max_model_len=64)
    base.update(kw)
    return Scheduler(Config(**base), connector=connector)


def request(rid: str, prompt, **kw) -> Request:
    return Request(request_id=rid, prompt_token_ids=list(prompt), max_tokens=kw.pop("max_tokens", 4),
                   arrival_time=0.0, hash_block_size=4, **kw)


def test_tokens_after_load_cover_whole_pages_and_recompute_the_last():
    assert tokens_after_load(3, 4, 10) == 9  # 12 slots cover all 10 tokens: the last again
    assert tokens_after_load(2, 4, 10) == 8
    assert tokens_after_load(1, 4, 2) == 1


def test_async_load_waits_for_the_report_then_runs_from_the_loaded_tokens():
    c = Connector({"a": [(10, True)]})
    s = scheduler(c)
    s.add_request(request("a", range(1, 11)))
    out = s.schedule()
    assert out.num_scheduled_tokens == {}
    assert s.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert c.calls == [("lookup", "a", 0, (10, True)), ("alloc", "a", [1, 2, 3], 10)]
    s.update_from_output(out, {})
    assert s.schedule().num_scheduled_tokens == {}  # not reported yet: set aside again
    s.update_from_output(s.schedule(), {}, finished_recving=["a"])
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1}
    assert s.requests["a"].num_computed_tokens == 10
    assert len([call for call in c.calls if call[0] == "lookup"]) == 1  # never asked again


def test_unknown_answer_sets_the_request_aside_and_looks_again():
    c = Connector({"b": [(None, False), (2, False)]})
    s = scheduler(c)
    s.add_request(request("b", range(1, 7)))
    out = s.schedule()
    assert out.num_scheduled_tokens == {}
    s.update_from_output(out, {})
    out = s.schedule()
    assert out.num_scheduled_tokens == {"b": 4}  # 6 tokens, 2 loaded
    assert [call[0] for call in c.calls] == ["lookup", "lookup", "alloc"]


def test_kept_pages_are_freed_when_the_send_is_reported():
    c = Connector({}, keep=frozenset({"x"}))
    s = scheduler(c, num_blocks=4)
    s.add_request(request("x", range(1, 6), max_tokens=1))
    out = s.schedule()
    s.update_from_output(out, {"x": [9]})
    assert s.kv.pool.num_free_blocks() == 1  # finished, pages kept
    assert c.calls[-1] == ("finished", "x", [1, 2])
    s.update_from_output(s.schedule(), {}, finished_sending=["x"])
    assert s.kv.pool.num_free_blocks() == 3


AFTER_0_16 = frozenset({"aborted_load_keeps_pages_until_done", "loaded_preempted_request_resumes"})


def test_an_aborted_load_keeps_its_pages_until_reported_from_0_16_0():
    for rules, free_at_abort in ((frozenset(), 15), (AFTER_0_16, 12)):
        s = scheduler(Connector({"a": [(10, True)]}), rules=rules)
        s.add_request(request("a", range(1, 11)))
        s.update_from_output(s.schedule(), {})
        s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
        assert s.kv.pool.num_free_blocks() == free_at_abort, rules
        s.update_from_output(s.schedule(), {}, finished_recving=["a"])
        assert s.kv.pool.num_free_blocks() == 15 and "a" not in s.requests


def test_an_abort_after_the_load_was_reported_frees_at_once():
    s = scheduler(Connector({"a": [(10, True)]}), rules=AFTER_0_16)
    s.add_request(request("a", range(1, 11)))
    s.update_from_output(s.schedule(), {}, finished_recving=["a"])
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert s.kv.pool.num_free_blocks() == 15 and not s.finished_recving


def test_an_aborted_load_whose_pages_are_also_sent_is_reported_twice_and_raises():
    """quirks.ABORTED_LOAD_REPORTED_TWICE: the first report frees the request, the second
    names one no longer known."""
    s = scheduler(Connector({"a": [(10, True)]}, keep=frozenset({"a"})), rules=AFTER_0_16)
    s.add_request(request("a", range(1, 11)))
    s.update_from_output(s.schedule(), {})
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    s.update_from_output(s.schedule(), {}, finished_sending=["a"])
    with pytest.raises(AssertionError):
        s.update_from_output(s.schedule(), {}, finished_recving=["a"])


def test_a_preempted_request_waits_as_preempted_once_loaded_from_0_14_0():
    for rules, status in ((frozenset(), RequestStatus.WAITING),
                          (AFTER_0_16, RequestStatus.PREEMPTED)):
        s = scheduler(Connector({"a": [(10, True)]}), rules=rules)
        a = request("a", range(1, 11))
        a.num_preemptions = 1  # as if preempted before its load
        s.add_request(a)
        s.update_from_output(s.schedule(), {}, finished_recving=["a"])
        assert s.waits_for_remote_kv(a) is False
        assert a.status == status, rules


def test_an_async_load_leaves_the_pages_of_prefills_under_way_from_0_23_0():
    """async_load_leaves_room_for_prefills: p (56 tokens, 4 a step) holds 1 of its 14 pages;
    a's load needs 3 of the 14 free pages, which p still needs 13 of."""
    for rules, loading in ((frozenset(), True),
                           (frozenset({"async_load_leaves_room_for_prefills"}), False)):
        s = scheduler(Connector({"a": [(10, True)]}), long_prefill_token_threshold=4,
                      rules=rules)
        s.add_request(request("p", range(100, 156)))
        s.add_request(request("a", range(1, 11)))
        out = s.schedule()
        assert out.num_scheduled_tokens == {"p": 4}, rules
        assert (s.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS) == loading, rules


def test_a_finished_request_hands_the_connector_its_computed_pages_from_0_25_0():
    """connector_finish_sees_computed_pages: with an eagle drafter, the prefill of 4 tokens
    also takes the page of its lookahead slot; at the finish only the first page holds
    computed tokens."""
    for rules, pages in ((frozenset({"admission_reserves_lookahead"}), [1, 2]),
                         (frozenset({"admission_reserves_lookahead",
                                     "connector_finish_sees_computed_pages"}), [1])):
        c = Connector({})
        s = scheduler(c, use_eagle=True, num_speculative_tokens=1, rules=rules)
        s.add_request(request("a", range(1, 5), max_tokens=1))
        out = s.schedule()
        assert out.scheduled_new_reqs[0].block_ids == [[1, 2]], rules
        s.update_from_output(out, {"a": [7]})
        assert c.calls[-1] == ("finished", "a", pages), rules
