"""The named fixture streams, each pinning one rule, checked against the real vLLM 0.11.0.

Every expected number below was worked out by hand from vLLM 0.11.0's scheduling and KV-cache
rules (the reasoning is in the comments), then checked against the real engine; none is copied
from a recorded trace.  Conventions used throughout:

* page 0 is the null page, so the free queue of a fresh pool is [1, 2, ..., num_gpu_blocks - 1];
* a slot is ``page_id * block_size + offset``; ``slots`` lists [first, last+1) runs;
* ``new_block_ids`` of a request admitted this step lists ALL its pages (prefix hits included), of a
  running request only the pages added this step;
* a request's pages are freed in reverse order (tail first) and appended to the free queue, and
  ``get_new_blocks`` pops from the queue head;
* a request that stops in update_from_output of step k shows up in ``finished`` at step k + 1;
  an abort at step k shows up at step k (it happens before that step's schedule()).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.checks.golden import recorded_crashes, recorded_verdicts
from harness.loop.runner import run
from harness.formats.stream import load_stream
from harness.formats.trace import COMPLETED, ENGINE_FAILURE

pytestmark = [pytest.mark.needs_vllm]

STREAMS = Path(__file__).resolve().parent.parent / "fixtures" / "streams"
STREAM_FILES = sorted(STREAMS.glob("*.json"))


def trace_of(engine, name: str):
    trace = run(engine, load_stream(STREAMS / f"{name}.json"))
    assert trace.verdict == COMPLETED, trace.failure
    return trace


def sched(trace) -> list[list[tuple[str, int]]]:
    """Per step: [(req_id, tokens)] in vLLM's num_scheduled_tokens order."""
    return [[(rid, n) for rid, n in s["scheduled"]] for s in trace.steps]


def col(trace, field: str, rid: str | None = None) -> list:
    """Per step: one field, or one request's entry of a per-request field (None if absent)."""
    if rid is None:
        return [s[field] for s in trace.steps]
    return [s[field].get(rid) for s in trace.steps]


def at(trace, step: int) -> dict:
    return trace.steps[step]


# ---------------------------------------------------------------------------------------------
# The fixture files themselves
# ---------------------------------------------------------------------------------------------


def test_at_least_thirty_named_streams():
    assert len(STREAM_FILES) >= 30


@pytest.mark.parametrize("path", STREAM_FILES, ids=[p.stem for p in STREAM_FILES])
def test_stream_file_is_named_and_described(path):
    data = json.loads(path.read_text())
    assert data["name"] == path.stem
    assert len(data["description"]) > 40
    load_stream(path)


def test_every_stream_completes_and_is_deterministic(vllm_engine):
    """Every bundled stream completes, except those recorded as a vLLM crash, which crash,
    and those recorded as a stall (verdict max_steps), which stall."""
    crashes = recorded_crashes()
    stalls = recorded_verdicts("max_steps")
    for path in STREAM_FILES:
        stream = load_stream(path)
        first = run(vllm_engine, stream)
        expected = ("engine_failure" if path.stem in crashes
                    else "max_steps" if path.stem in stalls else COMPLETED)
        assert first.verdict == expected, (path.stem, first.failure)
        # One engine runs many streams: it rebuilds the scheduler, so a rerun is byte-identical.
        assert run(vllm_engine, stream).dumps() == first.dumps(), path.stem


# ---------------------------------------------------------------------------------------------
# The seed family
# ---------------------------------------------------------------------------------------------


def test_seed_eos_4_1_1(vllm_engine):
    t = trace_of(vllm_engine, "seed_eos_4_1_1")
    # Whole 4-token prompt in one step (budget 128), then one decode token per step.
    assert sched(t) == [[("A", 4)], [("A", 1)], [("A", 1)]]
    assert col(t, "num_computed_tokens", "A") == [4, 5, 6]
    assert col(t, "computed_before", "A") == [0, 4, 5]
    # First free page is 1; 6 tokens never leave it.
    assert col(t, "new_block_ids") == [{"A": [[1]]}, {}, {}]
    assert col(t, "slots") == [{"A": [[16, 20]]}, {"A": [[20, 21]]}, {"A": [[21, 22]]}]
    assert col(t, "emitted") == [{"A": [5]}, {"A": [6]}, {"A": [7]}]
    assert col(t, "status", "A") == ["RUNNING", "RUNNING", "FINISHED_STOPPED"]
    # 64 pages - null page - page 1; the page comes back when A stops.
    assert col(t, "free_blocks") == [62, 62, 63]
    assert col(t, "prefix_hit_tokens") == [{"A": 0}, {}, {}]


def test_seed_budget_split_2_2(vllm_engine):
    t = trace_of(vllm_engine, "seed_budget_split_2_2")
    # Budget 2: chunks of 2 + 2, the first chunk is a partial prefill and emits nothing.
    assert sched(t) == [[("A", 2)], [("A", 2)], [("A", 1)], [("A", 1)]]
    assert col(t, "num_computed_tokens", "A") == [2, 4, 5, 6]
    assert col(t, "emitted", "A") == [None, [5], [6], [7]]
    assert col(t, "slots", "A") == [[[16, 18]], [[18, 20]], [[20, 21]], [[21, 22]]]
    assert col(t, "status", "A")[-1] == "FINISHED_STOPPED"


def test_seed_fcfs_preempt_recompute(vllm_engine):
    t = trace_of(vllm_engine, "seed_fcfs_preempt_recompute")
    # 4 usable pages of 4. A=[1], B=[2]; 5th token each -> A=[1,3], B=[2,4]; pool empty.
    assert col(t, "new_block_ids")[:2] == [{"A": [[1]], "B": [[2]]}, {"A": [[3]], "B": [[4]]}]
    assert col(t, "free_blocks")[1:5] == [0, 0, 0, 0]
    assert sched(t)[:5] == [[("A", 4), ("B", 4)]] + [[("A", 1), ("B", 1)]] * 4
    # Step 5: A (8 computed) needs a 9th slot = third page; FCFS pops the last running: B.
    s5 = at(t, 5)
    assert s5["preempted"] == ["B"]
    assert sched(t)[5] == [("A", 1)]
    # B freed [4, 2] (tail first); A pops 4.
    assert s5["new_block_ids"] == {"A": [[4]]}
    assert s5["status"]["B"] == "PREEMPTED" and s5["num_computed_tokens"]["B"] == 0
    assert s5["status"]["A"] == "FINISHED_STOPPED"   # t7 = EOS
    # Step 6: B recomputes prompt (4) + outputs (5) from 0; no prefix caching, so no hit.
    # Free queue: [2] + A's pages reversed [4, 3, 1] -> B takes [2, 4, 3].
    s6 = at(t, 6)
    assert sched(t)[6] == [("B", 9)]
    assert s6["computed_before"] == {"B": 0}
    assert s6["new_block_ids"] == {"B": [[2, 4, 3]]}
    assert s6["prefix_hit_tokens"] == {"B": 0}
    assert s6["finished"] == ["A"]
    assert s6["emitted"] == {"B": [21]}
    assert s6["slots"] == {"B": [[8, 12], [16, 20], [12, 13]]}


# ---------------------------------------------------------------------------------------------
# Token budget, chunking, limits
# ---------------------------------------------------------------------------------------------


def test_chunked_prefill_budget(vllm_engine):
    t = trace_of(vllm_engine, "chunked_prefill_budget")
    # Budget 8: running requests first, then waiting ones take what is left.
    assert sched(t) == [[("A", 6), ("B", 2)], [("A", 1), ("B", 4)], [("A", 1), ("B", 1)]]
    assert col(t, "emitted") == [{"A": [1]}, {"A": [2], "B": [4]}, {"A": [3], "B": [5]}]
    assert col(t, "num_computed_tokens", "B") == [2, 6, 7]


def test_long_prefill_threshold(vllm_engine):
    t = trace_of(vllm_engine, "long_prefill_threshold")
    # Threshold 3 caps the waiting admission and the running continuation alike.
    assert sched(t) == [[("A", 3)], [("A", 3)], [("A", 2)], [("A", 1)]]
    assert col(t, "emitted", "A") == [None, None, [1], [2]]
    assert col(t, "num_computed_tokens", "A") == [3, 6, 8, 9]


def test_max_model_len_cap_minus_one(vllm_engine):
    t = trace_of(vllm_engine, "max_model_len_cap_minus_one")
    assert sched(t)[0] == [("A", 12)]
    # 13 tokens + 4 drafts, but 16 - 1 - 12 = 3 tokens at most: 1 + 2 drafts.
    s1 = at(t, 1)
    assert sched(t)[1] == [("A", 3)]
    assert s1["spec_tokens"] == {"A": [2, 3]}
    assert s1["emitted"] == {"A": [2, 3, 4]}
    # 15 slots -> a fourth page; 13 + 3 = 16 tokens = max_model_len.
    assert s1["new_block_ids"] == {"A": [[4]]}
    assert s1["status"] == {"A": "FINISHED_LENGTH_CAPPED"}
    assert len(t.steps) == 2


def test_waiting_blocked_after_preemption(vllm_engine):
    t = trace_of(vllm_engine, "waiting_blocked_after_preemption")
    s5 = at(t, 5)
    assert s5["preempted"] == ["B"]
    # C (priority 0) arrived at step 5, stands ahead of B (priority 1) in the waiting
    # queue and would fit in the page left free, but a step that preempted admits no
    # waiting request.
    assert sched(t)[5] == [("A", 1)]
    assert s5["status"]["C"] == "WAITING"
    # Step 6: the queue by (priority, arrival) is [C, B]; both admitted.
    assert sched(t)[6] == [("C", 2), ("B", 9)]


def test_max_num_seqs_limit(vllm_engine):
    t = trace_of(vllm_engine, "max_num_seqs_limit")
    assert sched(t)[:3] == [[("A", 4), ("B", 4)], [("A", 1), ("B", 1)], [("B", 1), ("C", 4)]]
    assert col(t, "status", "C")[:2] == ["WAITING", "WAITING"]
    assert at(t, 1)["status"]["A"] == "FINISHED_LENGTH_CAPPED"


def test_chunked_prefill_off_skip_keeps_head(vllm_engine):
    t = trace_of(vllm_engine, "chunked_prefill_off_skip_keeps_head")
    # Budget 32: A 20 -> 12 left; B (20) skipped; C (12) fits -> 0 left, D untouched.
    assert sched(t)[0] == [("A", 20), ("C", 12)]
    assert at(t, 0)["status"]["B"] == "WAITING" and at(t, 0)["status"]["D"] == "WAITING"
    # B went back to the head: [B, D], not [D, B].
    assert sched(t)[1] == [("A", 1), ("C", 1), ("B", 20), ("D", 10)]


def test_waiting_alloc_fail_blocks_queue(vllm_engine):
    t = trace_of(vllm_engine, "waiting_alloc_fail_blocks_queue")
    # A holds 4 of 6 pages; B needs 3 > 2 free -> the waiting loop stops; C (1 page) is not tried.
    assert sched(t)[1:3] == [[("A", 1)], [("A", 1)]]
    assert col(t, "status", "C")[1:3] == ["WAITING", "WAITING"]
    # A reached 16 tokens: all 4 pages full and cached; freed tail first -> queue [5, 6, 4, 3, 2, 1].
    s3 = at(t, 3)
    assert sched(t)[3] == [("B", 12), ("C", 2)]
    assert s3["new_block_ids"] == {"B": [[5, 6, 4]], "C": [[3]]}
    assert s3["evicted"] == [4, 3]


# ---------------------------------------------------------------------------------------------
# Prefix cache
# ---------------------------------------------------------------------------------------------


def test_block_table_free_queue_order(vllm_engine):
    t = trace_of(vllm_engine, "block_table_free_queue_order")
    s0 = at(t, 0)
    assert s0["new_block_ids"] == {"A": [[1, 2, 3, 4]], "B": [[1, 2, 3, 5]]}
    assert s0["prefix_hit_tokens"] == {"A": 0, "B": 48}
    assert sched(t)[0] == [("A", 55), ("B", 7)]
    # A frees [4,3,2,1]: only 4 reaches ref 0; B frees [5,3,2,1]: all reach 0.
    s1 = at(t, 1)
    assert s1["finished"] == ["A", "B"]
    assert s1["new_block_ids"] == {"C": [[6, 7, 8, 9, 10, 4, 5, 3, 2, 1]]}
    # Pages 4 and 5 never got full (56 tokens), so only 3, 2, 1 had a hash to drop.
    assert s1["evicted"] == [3, 2, 1]


def test_prefix_hit_whole_blocks_only(vllm_engine):
    t = trace_of(vllm_engine, "prefix_hit_whole_blocks_only")
    s2 = at(t, 2)
    assert s2["prefix_hit_tokens"] == {"B": 16}
    assert s2["computed_before"] == {"B": 16}
    assert sched(t)[2] == [("B", 7)]
    # A's pages freed [2, 1] after the fresh ones: B touches 1, takes 3.
    assert s2["new_block_ids"] == {"B": [[1, 3]]}


def test_prefix_hit_cap_num_tokens_minus_one(vllm_engine):
    t = trace_of(vllm_engine, "prefix_hit_cap_num_tokens_minus_one")
    s2 = at(t, 2)
    # B: 32 tokens -> at most 31 -> one whole page; C: 33 -> 32 -> two pages.
    assert s2["prefix_hit_tokens"] == {"B": 16, "C": 32}
    assert sched(t)[2] == [("B", 16), ("C", 1)]
    assert s2["new_block_ids"] == {"B": [[1, 4]], "C": [[1, 2, 5]]}


def test_prefix_hit_same_step(vllm_engine):
    t = trace_of(vllm_engine, "prefix_hit_same_step")
    s0 = at(t, 0)
    assert s0["prefix_hit_tokens"] == {"A": 0, "B": 16}
    assert sched(t)[0] == [("A", 18), ("B", 2)]
    assert s0["new_block_ids"] == {"A": [[1, 2]], "B": [[1, 3]]}


def test_prefix_cache_salt(vllm_engine):
    t = trace_of(vllm_engine, "prefix_cache_salt")
    hits = [s["prefix_hit_tokens"] for s in t.steps]
    assert hits == [{"A": 0}, {"B": 0}, {"C": 16}, {"D": 0}]


def test_prompt_logprobs_no_hit(vllm_engine):
    t = trace_of(vllm_engine, "prompt_logprobs_no_hit")
    assert at(t, 1)["prefix_hit_tokens"] == {"B": 0}
    assert sched(t)[1] == [("B", 40)]
    assert at(t, 2)["prefix_hit_tokens"] == {"C": 32}
    assert sched(t)[2] == [("C", 8)]


def test_hit_on_free_page_counts(vllm_engine):
    t = trace_of(vllm_engine, "hit_on_free_page_counts")
    # Step 1: free pages are exactly A's cached [2, 1]; B needs 1 new + 2 evictable hits = 3 > 2.
    assert sched(t)[1] == [("C", 1)]
    assert at(t, 1)["status"]["B"] == "WAITING"
    # Step 2: queue [2, 1, 6, 5, 4, 3]; B touches 1, 2 and pops 6 (C's full page: evicted).
    s2 = at(t, 2)
    assert s2["prefix_hit_tokens"] == {"B": 8}
    assert sched(t)[2] == [("B", 1)]
    assert s2["new_block_ids"] == {"B": [[1, 2, 6]]}
    assert s2["evicted"] == [6]


def test_evict_cached_lru_tail_first(vllm_engine):
    t = trace_of(vllm_engine, "evict_cached_lru_tail_first")
    s1 = at(t, 1)
    assert s1["new_block_ids"] == {"B": [[4, 3, 2]]}
    assert s1["evicted"] == [3, 2]
    s2 = at(t, 2)
    assert s2["prefix_hit_tokens"] == {"C": 4}
    assert s2["new_block_ids"] == {"C": [[1, 2, 3, 4]]}
    assert s2["evicted"] == [2, 3, 4]   # B's three full pages, in B's own free order


def test_cached_page_loses_hash_on_reuse(vllm_engine):
    t = trace_of(vllm_engine, "cached_page_loses_hash_on_reuse")
    assert at(t, 1)["new_block_ids"] == {"B": [[2, 1]]}
    assert at(t, 1)["evicted"] == [1]
    assert at(t, 2)["prefix_hit_tokens"] == {"C": 0}
    assert sched(t)[2] == [("C", 5)]


def test_reset_prefix_cache(vllm_engine):
    t = trace_of(vllm_engine, "reset_prefix_cache")
    assert col(t, "prefix_cache_reset") == [None, True, False, None]
    assert at(t, 1)["prefix_hit_tokens"] == {"B": 0}
    assert sched(t)[1] == [("B", 9)]
    # A reset drops hashes only: the free queue order is untouched.
    assert at(t, 1)["new_block_ids"] == {"B": [[4, 5, 6]]}


def test_no_prefix_caching(vllm_engine):
    t = trace_of(vllm_engine, "no_prefix_caching")
    assert at(t, 1)["prefix_hit_tokens"] == {"B": 0}
    assert sched(t)[1] == [("B", 9)]
    assert at(t, 1)["new_block_ids"] == {"B": [[4, 3, 2]]}
    assert all(s["evicted"] == [] for s in t.steps)


# ---------------------------------------------------------------------------------------------
# Preemption and priority
# ---------------------------------------------------------------------------------------------


def test_fcfs_preempt_last_running(vllm_engine):
    t = trace_of(vllm_engine, "fcfs_preempt_last_running")
    s5 = at(t, 5)
    assert s5["preempted"] == ["C"]
    assert sched(t)[5] == [("A", 1), ("B", 1)]
    assert s5["new_block_ids"] == {"A": [[6]]}   # C freed [6, 5]
    assert s5["status"]["C"] == "PREEMPTED"


def test_fcfs_preempt_self(vllm_engine):
    t = trace_of(vllm_engine, "fcfs_preempt_self")
    s1 = at(t, 1)
    assert s1["preempted"] == ["B"]
    assert sched(t)[1] == [("A", 1)]
    # B freed [3, 2]; A (stopped at step 1) freed [1]: queue [3, 2, 1].
    assert sched(t)[2] == [("B", 9)]
    assert at(t, 2)["new_block_ids"] == {"B": [[3, 2, 1]]}


def test_priority_preempt_max_priority(vllm_engine):
    t = trace_of(vllm_engine, "priority_preempt_max_priority")
    s5 = at(t, 5)
    assert s5["preempted"] == ["B"]          # FCFS would have taken C
    assert sched(t)[5] == [("A", 1), ("C", 1)]
    assert s5["new_block_ids"] == {"A": [[4]]}   # B freed [4, 3]


def test_priority_preempt_already_scheduled_quirk(vllm_engine):
    t = trace_of(vllm_engine, "priority_preempt_already_scheduled_quirk")
    s2 = at(t, 2)
    # B was scheduled first, then became A's victim: it stays in num_scheduled_tokens.
    assert s2["preempted"] == ["B"]
    assert sched(t)[2] == [("B", 1), ("A", 1)]
    assert s2["status"]["B"] == "PREEMPTED"
    assert s2["num_computed_tokens"]["B"] == 1     # reset to 0, then +1 after schedule
    assert s2["new_block_ids"] == {"A": [[2]]}      # B freed [2, 1]
    assert s2["emitted"]["B"] == [22]
    # B resumes with num_computed_tokens 1: no prefix lookup, 7 - 1 = 6 tokens from position 1.
    s4 = at(t, 4)
    assert sched(t)[4] == [("B", 6)]
    assert s4["computed_before"] == {"B": 1}
    assert s4["prefix_hit_tokens"] == {}
    assert s4["new_block_ids"] == {"B": [[1, 2]]}
    assert vllm_engine.state("B").num_output_tokens == 4   # the step-2 token was kept


def test_priority_queue_order(vllm_engine):
    t = trace_of(vllm_engine, "priority_queue_order")
    admitted = [rid for s in t.steps for rid in s["prefix_hit_tokens"]]
    assert admitted == ["B", "D", "C", "A"]
    assert sched(t)[1] == [("B", 1)]           # D does not preempt the running B


def test_resumed_recomputes_outputs(vllm_engine):
    t = trace_of(vllm_engine, "resumed_recomputes_outputs")
    assert at(t, 5)["preempted"] == ["B"]
    # 4 prompt + 4 outputs, budget 6: 6 (no output) + 2 (emits 24).
    assert sched(t)[7:9] == [[("B", 6)], [("B", 2)]]
    assert col(t, "computed_before", "B")[7:9] == [0, 6]
    assert col(t, "emitted", "B")[7:9] == [None, [24]]


def test_hit_after_preemption(vllm_engine):
    t = trace_of(vllm_engine, "hit_after_preemption")
    s5 = at(t, 5)
    assert s5["preempted"] == ["B"]
    assert s5["new_block_ids"] == {"A": [[4]]}
    assert s5["evicted"] == [4]
    s6 = at(t, 6)
    assert s6["prefix_hit_tokens"] == {"B": 4}
    assert s6["computed_before"] == {"B": 4}
    assert sched(t)[6] == [("B", 5)]
    assert s6["new_block_ids"] == {"B": [[2, 4, 3]]}


# ---------------------------------------------------------------------------------------------
# Speculative decoding
# ---------------------------------------------------------------------------------------------


def test_spec_ngram_partial_accept(vllm_engine):
    t = trace_of(vllm_engine, "spec_ngram_partial_accept")
    assert col(t, "spec_tokens", "A") == [None, [2, 3, 99], [5, 6, 7], None]
    assert sched(t) == [[("A", 6)], [("A", 4)], [("A", 4)], [("A", 1)]]
    assert col(t, "emitted", "A") == [[1], [2, 3, 4], [5, 6, 7, 8], [9]]
    # 6 + 4 - 1 rejected = 9; 9 + 4 - 0 = 13: always num_tokens - 1.
    assert col(t, "num_computed_tokens", "A") == [6, 9, 13, 14]


def test_spec_eagle_lookahead_drop_last_hit(vllm_engine):
    t = trace_of(vllm_engine, "spec_eagle_lookahead_drop_last_hit")
    assert at(t, 0)["new_block_ids"] == {"A": [[1, 2]]}   # no lookahead at admission
    s1 = at(t, 1)
    assert s1["spec_tokens"] == {"A": [2, 3]}
    assert s1["new_block_ids"]["A"] == [[3, 4]]          # 8 + 3 + 2 lookahead = 13 slots
    assert s1["prefix_hit_tokens"] == {"B": 4}            # 8 would hit, the last page is dropped
    assert s1["computed_before"]["B"] == 4


def test_spec_drafts_trimmed_to_budget(vllm_engine):
    t = trace_of(vllm_engine, "spec_drafts_trimmed_to_budget")
    s1 = at(t, 1)
    assert sched(t)[1] == [("A", 4), ("B", 2)]
    assert s1["spec_tokens"] == {"A": [2, 3, 4], "B": [12]}
    assert s1["emitted"] == {"A": [2, 3, 4, 5], "B": [12, 13]}
    assert s1["num_computed_tokens"] == {"A": 7, "B": 5}


# ---------------------------------------------------------------------------------------------
# Stops
# ---------------------------------------------------------------------------------------------


def test_stop_eos(vllm_engine):
    t = trace_of(vllm_engine, "stop_eos")
    assert col(t, "emitted", "A") == [[5], [7]]
    assert col(t, "status", "A") == ["RUNNING", "FINISHED_STOPPED"]


def test_stop_ignore_eos(vllm_engine):
    t = trace_of(vllm_engine, "stop_ignore_eos")
    assert col(t, "emitted", "A") == [[5], [7], [7], [9]]
    assert col(t, "status", "A")[-1] == "FINISHED_LENGTH_CAPPED"


def test_stop_token_ids_drop_after(vllm_engine):
    t = trace_of(vllm_engine, "stop_token_ids_drop_after")
    s1 = at(t, 1)
    assert s1["spec_tokens"] == {"A": [9, 6, 6]}
    assert s1["emitted"] == {"A": [9, 6, 6, 8]}      # what the model said
    assert s1["status"] == {"A": "FINISHED_STOPPED"}
    assert vllm_engine.state("A").num_output_tokens == 2   # 5, 9: the rest was dropped


def test_stop_max_tokens(vllm_engine):
    t = trace_of(vllm_engine, "stop_max_tokens")
    assert col(t, "emitted", "A") == [[5], [6]]
    assert col(t, "status", "A") == ["RUNNING", "FINISHED_LENGTH_CAPPED"]


def test_stop_max_model_len(vllm_engine):
    t = trace_of(vllm_engine, "stop_max_model_len")
    assert sched(t) == [[("A", 12)], [("A", 1)], [("A", 1)], [("A", 1)]]
    assert col(t, "status", "A")[-1] == "FINISHED_LENGTH_CAPPED"
    assert vllm_engine.state("A").num_output_tokens == 4


# ---------------------------------------------------------------------------------------------
# Aborts and finished reporting
# ---------------------------------------------------------------------------------------------


def test_abort_waiting(vllm_engine):
    t = trace_of(vllm_engine, "abort_waiting")
    assert col(t, "status", "B")[:3] == ["WAITING", "WAITING", "FINISHED_ABORTED"]
    assert col(t, "finished") == [[], [], ["B"], []]
    assert all(rid != "B" for step in sched(t) for rid, _ in step)
    assert col(t, "free_blocks") == [14, 14, 14, 15]


def test_abort_running(vllm_engine):
    t = trace_of(vllm_engine, "abort_running")
    s2 = at(t, 2)
    assert s2["finished"] == ["B"]
    assert sched(t)[2] == [("A", 1)]
    assert s2["status"]["B"] == "FINISHED_ABORTED"
    assert col(t, "free_blocks")[1:3] == [13, 14]


def test_abort_preempted(vllm_engine):
    t = trace_of(vllm_engine, "abort_preempted")
    assert at(t, 5)["preempted"] == ["B"]
    s6 = at(t, 6)
    assert s6["finished"] == ["B"]
    assert s6["status"]["B"] == "FINISHED_ABORTED"
    assert all(rid != "B" for step in sched(t)[5:] for rid, _ in step)


def test_finished_reported_next_step(vllm_engine):
    t = trace_of(vllm_engine, "finished_reported_next_step")
    assert col(t, "status", "A")[1] == "FINISHED_LENGTH_CAPPED"
    assert col(t, "finished") == [[], [], ["A"], []]


# ---------------------------------------------------------------------------------------------
# Hooks and failures
# ---------------------------------------------------------------------------------------------


def test_engine_failure_is_a_verdict_not_a_crash(vllm_engine, monkeypatch):
    from harness.engines.vllm_adapter import Scheduler  # vLLM's, as the adapter imports it

    real = Scheduler.update_from_output
    calls = []

    def flaky(self, scheduler_output, model_runner_output):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom in update_from_output")
        return real(self, scheduler_output, model_runner_output)

    monkeypatch.setattr(Scheduler, "update_from_output", flaky)
    t = run(vllm_engine, load_stream(STREAMS / "seed_eos_4_1_1.json"))
    assert t.verdict == ENGINE_FAILURE
    assert t.failure["step"] == 1            # step 0 was recorded, step 1 failed
    assert "RuntimeError: boom in update_from_output" in t.failure["message"]
    assert len(t.steps) == 1
    monkeypatch.undo()
    # The same engine runs the next stream cleanly.
    assert run(vllm_engine, load_stream(STREAMS / "seed_eos_4_1_1.json")).verdict == COMPLETED


def test_failure_in_schedule_is_reported(vllm_engine, monkeypatch):
    from harness.engines.vllm_adapter import Scheduler  # vLLM's, as the adapter imports it

    def broken(self, *args, **kwargs):
        raise AssertionError("no pages today")

    monkeypatch.setattr(Scheduler, "schedule", broken)
    t = run(vllm_engine, load_stream(STREAMS / "chunked_prefill_budget.json"))
    assert t.verdict == ENGINE_FAILURE
    assert t.failure["step"] == 0 and t.steps == []
    assert "AssertionError: no pages today" in t.failure["message"]
