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
