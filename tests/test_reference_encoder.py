"""The reference's encoder cache and encoder-input scheduling, on small cases.

The first part restates the facts of vLLM's own tests
(tests/v1/core/test_encoder_cache_manager.py, and the multimodal cases of
tests/v1/core/test_scheduler.py) against the reference's API; the rest are
edge cases of our own, each asserting something a plausible mistake would
get wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from reference.encoder_cache import EncoderCacheManager, EncoderInput, encoder_budgets
from reference.encoder_inputs import free_encoder_inputs, try_schedule_encoder_inputs

BIG = 10**9


@dataclass
class Req:
    request_id: str
    encoder_inputs: list[EncoderInput] = field(default_factory=list)


def req(request_id: str, hashes: list[str], lengths: list[int], offsets: list[int] | None = None) -> Req:
    offsets = offsets or [0] * len(hashes)
    return Req(request_id, [EncoderInput(o, n, h) for o, n, h in zip(offsets, lengths, hashes)])


def allocated(cache: EncoderCacheManager, r: Req, *input_ids: int) -> None:
    for i in input_ids:
        assert cache.can_allocate(r, i, BIG, 0)
        cache.allocate(r, i)


def consistent(cache: EncoderCacheManager) -> bool:
    """Freeable room is free room plus every freeable entry; freeable entries have no holder."""
    return (cache.num_freeable_slots == cache.num_free_slots + sum(cache.freeable.values())
            and all(not cache.holders[h] for h in cache.freeable))


# -- vLLM's facts: the cache ---------------------------------------------------------


def test_allocate_then_reuse_then_free_twice():
    cache = EncoderCacheManager(10)
    r = req("r1", ["imgA"], [4])
    assert not cache.check_and_update_cache(r, 0)
    allocated(cache, r, 0)
    assert cache.check_and_update_cache(r, 0)
    assert cache.holders["imgA"] == {"r1"}
    assert cache.num_free_slots == 6
    cache.free_encoder_input(r, 0)
    cache.free_encoder_input(r, 0)  # the second is a no-op
    assert cache.holders["imgA"] == set() and "imgA" in cache.freeable
    assert (cache.num_free_slots, cache.num_freeable_slots) == (6, 10)
    assert consistent(cache)


def test_last_holder_leaving_makes_the_entry_freeable():
    cache = EncoderCacheManager(10)
    r = req("req2", ["img3"], [5])
    allocated(cache, r, 0)
    assert len(cache.holders["img3"]) == 1
    cache.free_encoder_input(r, 0)
    assert not cache.holders["img3"] and "img3" in cache.freeable
    assert cache.num_freeable_slots == 10


def test_free_lets_go_of_every_item_of_the_request():
    cache = EncoderCacheManager(10)
    r = req("req3", ["a", "b"], [2, 3])
    allocated(cache, r, 0, 1)
    cache.free(r)
    assert not cache.holders["a"] and not cache.holders["b"]
    assert set(cache.freeable) == {"a", "b"}
    assert cache.num_freeable_slots == 10


def test_a_full_cache_evicts_a_freeable_entry():
    cache = EncoderCacheManager(10)
    r1, r2 = req("req1", ["x"], [6]), req("req2", ["y"], [5])
    allocated(cache, r1, 0)
    cache.free_encoder_input(r1, 0)
    allocated(cache, r2, 0)
    assert "x" not in cache.holders
    assert cache.get_freed_mm_hashes() == ["x"]


def test_cached_input_ids_are_those_whose_hash_is_in_the_cache():
    cache = EncoderCacheManager(10)
    r = req("reqX", ["m", "n", "o"], [2, 4, 3])
    allocated(cache, r, 0, 2)
    assert cache.get_cached_input_ids(r) == {0, 2}


def test_a_hit_takes_a_freeable_entry_back():
    cache = EncoderCacheManager(10)
    r = req("reqY", ["imgZ"], [4])
    allocated(cache, r, 0)
    cache.free_encoder_input(r, 0)
    assert cache.check_and_update_cache(r, 0)
    assert len(cache.holders["imgZ"]) == 1 and "imgZ" not in cache.freeable
    assert cache.num_freeable_slots == 6


def test_get_freed_mm_hashes_forgets_what_it_returned():
    cache = EncoderCacheManager(10)
    r1, r2 = req("reqA", ["a"], [5]), req("reqB", ["b"], [6])
    allocated(cache, r1, 0)
    cache.free_encoder_input(r1, 0)
    allocated(cache, r2, 0)
    assert cache.get_freed_mm_hashes() == ["a"]
    assert cache.get_freed_mm_hashes() == []


def test_room_counts_the_items_already_accepted_in_the_step():
    cache = EncoderCacheManager(10)
    r = req("reqA", ["a", "b"], [5, 6])
    assert cache.can_allocate(r, 0, 100, 0)
    assert not cache.can_allocate(r, 1, 100 - 5, 5)


def test_the_compute_budget_limits_the_items_of_a_step():
    cache = EncoderCacheManager(100)
    r = req("reqA", ["a", "b"], [5, 6])
    assert cache.can_allocate(r, 0, 10, 0)
    assert not cache.can_allocate(r, 1, 10 - 5, 5)


def test_room_is_the_placeholder_length():
    # 0.11.0 has no embedding mask in the cache: 100 placeholder tokens take 100 slots.
    cache = EncoderCacheManager(100)
    allocated(cache, req("r1", ["img1"], [100]), 0)
    assert cache.num_free_slots == 0


# -- vLLM's facts: the scheduler -------------------------------------------------------


def test_every_request_of_a_roomy_step_encodes_its_one_item():
    budget, cache = 8192, EncoderCacheManager(8192)
    for i in range(10):
        r = req(str(i), [f"h{i}"], [100], [i])
        ids, n, budget = try_schedule_encoder_inputs(r, 0, 200, budget, cache)
        assert (ids, n) == ([0], 200)
        cache.allocate(r, 0)
    assert budget == 8192 - 1000


def test_partial_requests_stop_before_an_image_out_of_budget():
    budget, cache = 1024, EncoderCacheManager(1024)
    rs = [req(f"r{i}", [f"img{i}"], [600], [100]) for i in range(3)]
    token_budget = 1024
    granted = []
    for r in rs:
        ids, n, budget = try_schedule_encoder_inputs(r, 0, min(800, token_budget), budget, cache)
        for i in ids:
            cache.allocate(r, i)
        token_budget -= n
        granted.append((ids, n))
    assert granted == [([0], 800), ([], 100), ([], 100)]
    computed = {"r0": 800, "r1": 100, "r2": 100}
    for r in rs:
        free_encoder_inputs(r, computed[r.request_id], cache)
    assert "img0" in cache.freeable

    budget = 1024
    ids, n, budget = try_schedule_encoder_inputs(rs[0], 800, 1, budget, cache)
    assert (ids, n) == ([], 1)
    ids, n, budget = try_schedule_encoder_inputs(rs[1], 100, 700, budget, cache)
    assert (ids, n, budget) == ([0], 700, 424)
    cache.allocate(rs[1], 0)
    assert cache.get_freed_mm_hashes() == ["img0"]
    # The third request stopped exactly at its image last step: nothing is left to grant.
    ids, n, budget = try_schedule_encoder_inputs(rs[2], 100, 700, budget, cache)
    assert (ids, n, budget) == ([], 0, 424)


def test_no_chunking_stops_before_an_image_the_step_would_split():
    cache = EncoderCacheManager(1024)
    r = req("r", ["img"], [800], [400])
    assert try_schedule_encoder_inputs(r, 0, 1024, 1024, cache, disable_chunked_mm_input=True) \
        == ([], 400, 1024)
    assert try_schedule_encoder_inputs(r, 400, 800, 1024, cache, disable_chunked_mm_input=True) \
        == ([0], 800, 224)


def test_no_chunking_cut_moves_one_token_earlier_for_a_drafter_from_0_17_0():
    """eagle_whole_item_cut_one_token_earlier: the cut leaves room for the drafter's read one
    position ahead, down to nothing when the range starts right before the placeholder."""
    cache = EncoderCacheManager(1024)
    r = req("r", ["img"], [6], [5])
    for whole_item_lookahead, granted in ((0, 5), (1, 4)):
        assert try_schedule_encoder_inputs(r, 0, 7, 7, cache, disable_chunked_mm_input=True,
                                           lookahead=1, whole_item_lookahead=whole_item_lookahead) \
            == ([], granted, 7)
    assert try_schedule_encoder_inputs(r, 4, 3, 7, cache, disable_chunked_mm_input=True,
                                       lookahead=1, whole_item_lookahead=1) == ([], 0, 7)


def test_no_chunking_needs_the_largest_item_to_fit_a_step():
    with pytest.raises(ValueError):
        encoder_budgets({"image": 576}, max_num_encoder_input_tokens=100, encoder_cache_size=100,
                        max_num_batched_tokens=100, disable_chunked_mm_input=True)


# -- our own: the cache --------------------------------------------------------------


def test_eviction_order_is_the_order_entries_became_freeable():
    cache = EncoderCacheManager(10)
    r = req("r", ["a", "b", "c"], [3, 3, 4])
    allocated(cache, r, 0, 1, 2)
    cache.free_encoder_input(r, 1)  # b first, though a was made first
    cache.free_encoder_input(r, 0)
    other = req("o", ["d"], [3])
    assert cache.can_allocate(other, 0, BIG, 0)
    assert cache.get_freed_mm_hashes() == ["b"]
    assert cache.freeable_order() == [("a", 3)]


def test_eviction_stops_as_soon_as_there_is_room():
    cache = EncoderCacheManager(9)
    r = req("r", ["a", "b", "c"], [3, 3, 3])
    allocated(cache, r, 0, 1, 2)
    cache.free(r)
    assert cache.can_allocate(req("o", ["d"], [4]), 0, BIG, 0)
    assert cache.get_freed_mm_hashes() == ["a", "b"]
    assert (cache.num_free_slots, cache.num_freeable_slots) == (6, 9)
    assert consistent(cache)


def test_not_enough_freeable_room_evicts_nothing():
    cache = EncoderCacheManager(10)
    r = req("r", ["a", "b"], [4, 4])
    allocated(cache, r, 0, 1)
    cache.free_encoder_input(r, 0)
    assert not cache.can_allocate(req("o", ["c"], [7]), 0, BIG, 0)  # 2 free + 4 freeable < 7
    assert cache.freed == [] and cache.freeable_order() == [("a", 4)]


def test_comparisons_are_inclusive():
    cache = EncoderCacheManager(10)
    r = req("r", ["a"], [5])
    assert cache.can_allocate(r, 0, 5, 5)  # budget == item, room == item + accepted
    assert not cache.can_allocate(r, 0, 4, 0)
    assert not cache.can_allocate(r, 0, BIG, 6)


def test_the_budget_is_checked_against_the_item_alone():
    cache = EncoderCacheManager(100)
    assert cache.can_allocate(req("r", ["a"], [5]), 0, 5, 90)


def test_a_second_holder_changes_no_counter():
    cache = EncoderCacheManager(10)
    a, b = req("a", ["x"], [4]), req("b", ["x"], [4])
    allocated(cache, a, 0)
    assert cache.check_and_update_cache(b, 0)
    cache.free_encoder_input(a, 0)
    assert cache.holders["x"] == {"b"} and not cache.freeable
    assert (cache.num_free_slots, cache.num_freeable_slots) == (6, 6)


def test_a_hash_evicted_twice_is_reported_twice():
    cache = EncoderCacheManager(4)
    r, o = req("r", ["x"], [4]), req("o", ["y"], [4])
    for _ in range(2):
        allocated(cache, r, 0)
        cache.free(r)
        allocated(cache, o, 0)
        cache.free(o)
    assert cache.get_freed_mm_hashes() == ["x", "y", "x"]


def test_free_visits_items_in_set_order_not_index_order():
    # Ten items, only 1 and 8 cached: CPython iterates {1, 8} as 8, 1.
    hashes = [f"h{i}" for i in range(10)]
    r = req("r", hashes, [1] * 10)
    cache = EncoderCacheManager(20)
    allocated(cache, r, 1, 8)
    cache.free(r)
    assert cache.freeable_order() == [("h8", 1), ("h1", 1)]


def test_free_after_computing_visits_items_in_set_order_too():
    hashes = [f"h{i}" for i in range(10)]
    r = req("r", hashes, [1] * 10, list(range(10)))
    cache = EncoderCacheManager(20)
    allocated(cache, r, 1, 8)
    free_encoder_inputs(r, 10, cache)
    assert cache.freeable_order() == [("h8", 1), ("h1", 1)]


def test_a_request_with_one_hash_twice_frees_it_once():
    cache = EncoderCacheManager(10)
    r = req("r", ["x", "x"], [3, 3])
    allocated(cache, r, 0)
    assert cache.get_cached_input_ids(r) == {0, 1}
    cache.free(r)
    assert cache.freeable_order() == [("x", 3)] and cache.num_freeable_slots == 10


# -- our own: scheduling encoder inputs ------------------------------------------------


def test_a_cache_hit_takes_no_budget_and_no_room():
    cache = EncoderCacheManager(10)
    a, b = req("a", ["x"], [6], [2]), req("b", ["x"], [6], [2])
    allocated(cache, a, 0)
    assert try_schedule_encoder_inputs(b, 0, 10, 3, cache) == ([], 10, 3)
    assert cache.holders["x"] == {"a", "b"} and cache.num_free_slots == 4


def test_a_repeated_item_is_encoded_once_per_step():
    cache = EncoderCacheManager(10)
    r = req("r", ["x", "x"], [4, 4], [0, 10])
    assert try_schedule_encoder_inputs(r, 0, 20, 100, cache) == ([0], 20, 96)


def test_items_past_the_range_are_not_looked_up():
    cache = EncoderCacheManager(10)
    owner = req("o", ["x"], [2])
    allocated(cache, owner, 0)
    r = req("r", ["y", "x"], [2, 2], [0, 5])
    assert try_schedule_encoder_inputs(r, 0, 5, 100, cache) == ([0], 5, 98)
    assert cache.holders["x"] == {"o"}  # starting exactly at the range end: not needed


def test_a_computed_item_is_skipped_even_if_gone_from_the_cache():
    cache = EncoderCacheManager(10)
    r = req("r", ["x"], [4], [0])
    assert try_schedule_encoder_inputs(r, 4, 3, 100, cache) == ([], 3, 100)
    assert try_schedule_encoder_inputs(r, 3, 3, 100, cache) == ([0], 3, 96)


def test_a_failed_item_stops_the_visit_though_a_later_one_would_fit():
    cache = EncoderCacheManager(100)
    r = req("r", ["big", "small"], [50, 2], [5, 60])
    assert try_schedule_encoder_inputs(r, 0, 70, 10, cache) == ([], 5, 10)


def test_the_cut_is_before_the_failing_item_after_the_accepted_ones():
    cache = EncoderCacheManager(100)
    r = req("r", ["a", "b"], [4, 8], [2, 10])
    assert try_schedule_encoder_inputs(r, 0, 30, 10, cache) == ([0], 10, 6)


def test_a_hit_is_held_even_when_the_range_is_then_cut():
    cache = EncoderCacheManager(10)
    owner = req("o", ["x"], [4])
    allocated(cache, owner, 0)
    cache.free(owner)
    r = req("r", ["x", "y"], [4, 8], [0, 6])
    assert try_schedule_encoder_inputs(r, 0, 20, 100, cache) == ([], 6, 100)
    assert cache.holders["x"] == {"r"} and not cache.freeable  # taken back from freeable


def test_evictions_stand_when_the_item_is_accepted_but_never_allocated():
    cache = EncoderCacheManager(4)
    owner = req("o", ["x"], [4])
    allocated(cache, owner, 0)
    cache.free(owner)
    r = req("r", ["y"], [4], [0])
    assert try_schedule_encoder_inputs(r, 0, 4, 100, cache) == ([0], 4, 96)
    # The caller did not schedule r (say, no KV pages): x is gone all the same.
    assert cache.get_freed_mm_hashes() == ["x"] and cache.num_free_slots == 4


def test_no_budget_inside_a_placeholder_grants_nothing():
    cache = EncoderCacheManager(100)
    r = req("r", ["x"], [10], [4])
    assert try_schedule_encoder_inputs(r, 6, 20, 5, cache) == ([], 0, 5)


def test_no_chunking_spares_a_cache_hit():
    cache = EncoderCacheManager(100)
    owner = req("o", ["x"], [10])
    allocated(cache, owner, 0)
    r = req("r", ["x"], [10], [4])
    assert try_schedule_encoder_inputs(r, 0, 8, 100, cache, disable_chunked_mm_input=True) \
        == ([], 8, 100)


def test_no_chunking_spares_a_placeholder_already_entered():
    cache = EncoderCacheManager(100)
    r = req("r", ["x"], [10], [4])
    assert try_schedule_encoder_inputs(r, 5, 3, 100, cache, disable_chunked_mm_input=True) \
        == ([0], 3, 90)


def test_no_chunking_lets_a_range_end_exactly_at_the_placeholder_end():
    cache = EncoderCacheManager(100)
    r = req("r", ["x"], [10], [4])
    assert try_schedule_encoder_inputs(r, 0, 14, 100, cache, disable_chunked_mm_input=True) \
        == ([0], 14, 90)


def test_no_new_tokens_looks_nothing_up():
    cache = EncoderCacheManager(10)
    owner = req("o", ["x"], [4])
    allocated(cache, owner, 0)
    cache.free(owner)
    r = req("r", ["x"], [4], [0])
    assert try_schedule_encoder_inputs(r, 0, 0, 100, cache) == ([], 0, 100)
    assert "x" in cache.freeable


def test_encoder_decoder_encodes_at_the_start_only_and_skips_the_cache():
    cache = EncoderCacheManager(100)
    owner = req("o", ["x"], [10])
    allocated(cache, owner, 0)
    r = req("r", ["x", "x"], [10, 10], [0, 0])
    assert try_schedule_encoder_inputs(r, 0, 5, 100, cache, is_encoder_decoder=True) \
        == ([0, 1], 5, 80)
    assert try_schedule_encoder_inputs(r, 1, 5, 100, cache, is_encoder_decoder=True) \
        == ([], 5, 100)


def test_free_after_computing_lets_go_of_whole_placeholders_only():
    cache = EncoderCacheManager(100)
    r = req("r", ["a", "b"], [4, 4], [0, 6])
    allocated(cache, r, 0, 1)
    free_encoder_inputs(r, 9, cache)
    assert cache.freeable_order() == [("a", 4)]
    free_encoder_inputs(r, 10, cache)  # placeholder end == computed: done
    assert cache.freeable_order() == [("a", 4), ("b", 4)]


def test_encoder_decoder_lets_go_after_the_first_token():
    cache = EncoderCacheManager(100)
    r = req("r", ["a"], [40])
    allocated(cache, r, 0)
    free_encoder_inputs(r, 0, cache, is_encoder_decoder=True)
    assert not cache.freeable
    free_encoder_inputs(r, 1, cache, is_encoder_decoder=True)
    assert cache.freeable_order() == [("a", 40)]


# -- our own: the budgets --------------------------------------------------------------


def test_no_modality_means_no_encoder():
    assert encoder_budgets({}, max_num_encoder_input_tokens=8192, encoder_cache_size=8192,
                           max_num_batched_tokens=8192, disable_chunked_mm_input=True) == (0, 0)


def test_budgets_are_raised_to_the_largest_item():
    assert encoder_budgets({"image": 576, "audio": 1500}, max_num_encoder_input_tokens=1024,
                           encoder_cache_size=2048, max_num_batched_tokens=1500,
                           disable_chunked_mm_input=True) == (1500, 2048)


def test_a_request_refused_pages_lets_go_of_its_cache_hits_from_0_14_0():
    """failed_admission_lets_go_of_encoder_inputs: the lookup made the waiting request a
    holder of the cached item it found; refused pages, it stays one up to 0.13.0."""
    from reference.config import Config
    from reference.request import Request
    from reference.scheduler import Scheduler
    for rules, holders in ((frozenset(), {"r"}), (frozenset({"failed_admission_lets_go_of_encoder_inputs"}), set())):
        s = Scheduler(Config(rules=rules, block_size=4, num_blocks=3, max_num_batched_tokens=64,
                             max_num_seqs=4, max_model_len=64,
                             max_tokens_by_modality=(("image", 4),)))
        owner = req("o", ["x"], [4])
        allocated(s.encoder_cache, owner, 0)
        s.encoder_cache.free(owner)
        s.add_request(Request(request_id="r", prompt_token_ids=list(range(1, 13)), max_tokens=1,
                              arrival_time=0.0, encoder_inputs=(EncoderInput(0, 4, "x"),)))
        assert s.schedule().num_scheduled_tokens == {}  # 12 tokens, room for 8
        assert s.encoder_cache.holders["x"] == holders, rules


def test_an_output_cached_again_is_not_freed_on_the_worker_from_0_28_0():
    """recached_outputs_not_freed: x was evicted and cached again before the step's output
    was made; from 0.28.0 the worker is not told to free it."""
    from reference.config import Config
    from reference.scheduler import Scheduler
    for rules, freed in ((frozenset(), ["x", "y"]),
                         (frozenset({"recached_outputs_not_freed"}), ["y"])):
        s = Scheduler(Config(block_size=4, num_blocks=8, max_num_batched_tokens=64,
                             max_num_seqs=4, max_model_len=64, rules=rules,
                             max_tokens_by_modality=(("image", 4),)))
        allocated(s.encoder_cache, req("o", ["x"], [4]), 0)  # x is in the cache again
        s.encoder_cache.freed = ["x", "y"]  # both evicted earlier in the step
        assert s.schedule().free_encoder_mm_hashes == freed, rules


# -- 0.31.0: a hash that comes back with another length --------------------------------

def test_a_cached_hash_with_another_length_gets_the_request_nothing_and_names_it():
    cache = EncoderCacheManager(20)
    allocated(cache, req("r1", ["img"], [3]), 0)
    r2 = req("r2", ["img"], [4], offsets=[1])
    rejected: list[str] = []
    assert try_schedule_encoder_inputs(r2, 0, 5, 7, cache, rejected=rejected) == ([], 0, 7)
    assert rejected == ["r2"]
    # Without the rule (up to 0.30.0) the cached output is taken, whatever its length.
    assert try_schedule_encoder_inputs(r2, 0, 5, 7, cache) == ([], 5, 7)


def test_an_earlier_item_of_the_step_with_another_length_rejects_too():
    cache = EncoderCacheManager(20)
    r = req("r1", ["img", "other", "img"], [2, 2, 3], offsets=[0, 2, 4])
    rejected: list[str] = []
    # The budget the first two items took stays taken.
    assert try_schedule_encoder_inputs(r, 0, 8, 10, cache, rejected=rejected) == ([], 0, 6)
    assert rejected == ["r1"]


def test_the_same_length_is_no_mismatch_and_an_evicted_entry_is_forgotten():
    cache = EncoderCacheManager(4)
    first = req("r1", ["img"], [3])
    allocated(cache, first, 0)
    rejected: list[str] = []
    assert try_schedule_encoder_inputs(req("r2", ["img"], [3]), 0, 3, 9, cache,
                                       rejected=rejected) == ([], 3, 9)
    cache.free(first)
    cache.free(req("r2", ["img"], [3]))
    third = req("r3", ["new"], [4])
    allocated(cache, third, 0)  # evicts img
    assert "img" not in cache.lengths
    cache.free(third)
    assert try_schedule_encoder_inputs(req("r4", ["img"], [2]), 0, 2, 9, cache,
                                       rejected=rejected) == ([0], 2, 7)
    assert rejected == []


# -- 0.23.0 and 0.29.0: which items a request lets go of --------------------------------

def test_from_0_23_0_a_request_lets_go_only_of_the_items_it_took():
    """items_taken_per_request: r took x for its second copy only (its first was a prefix-cache
    hit).  Up to 0.22.1 being past the first copy lets go of x; from 0.23.0 it does not."""
    r = req("r", ["x", "x"], [3, 3], offsets=[2, 14])
    for per_request, holders in ((False, set()), (True, {"r"})):
        cache = EncoderCacheManager(6, items_taken_per_request=per_request)
        allocated(cache, req("a", ["x"], [3]), 0)
        cache.free(req("a", ["x"], [3]))
        assert cache.check_and_update_cache(r, 1)
        free_encoder_inputs(r, 16, cache)
        assert cache.holders["x"] == holders, per_request
        assert consistent(cache)
    assert cache.get_cached_input_ids(r) == {1}
    free_encoder_inputs(r, 17, cache)
    assert cache.holders["x"] == set() and cache.get_cached_input_ids(r) == set()
    assert cache.taken == {}


def test_from_0_23_0_free_visits_only_the_taken_items_and_forgets_them():
    cache = EncoderCacheManager(10, items_taken_per_request=True)
    r = req("r", ["x", "y", "z"], [2, 2, 2])
    allocated(cache, r, 0, 2)
    assert cache.get_cached_input_ids(r) == {0, 2}
    cache.free(r)
    assert list(cache.freeable) == ["x", "z"] and cache.taken == {}
    assert consistent(cache)


def test_from_0_29_0_a_repeated_item_is_held_until_its_last_copy_is_let_go_of():
    """held_to_last_occurrence: r took x at two places; letting go of the first keeps x held."""
    for last, holders in ((False, set()), (True, {"r"})):
        cache = EncoderCacheManager(6, items_taken_per_request=True, held_to_last_occurrence=last)
        r = req("r", ["x", "x"], [3, 3], offsets=[6, 14])
        allocated(cache, r, 0)
        assert cache.check_and_update_cache(r, 1)
        free_encoder_inputs(r, 16, cache)
        assert cache.holders["x"] == holders, last
        assert consistent(cache)
    free_encoder_inputs(r, 17, cache)
    assert cache.holders["x"] == set() and list(cache.freeable) == ["x"]
