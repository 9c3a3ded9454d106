"""Unit tests of the reference's block pool and KV cache manager (no vLLM needed)."""

from __future__ import annotations

import pytest

from reference.block_pool import BlockPool
from reference.config import Config
from reference.kv_cache_manager import KVCacheManager, block_ids
from reference.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from reference.request import Request


def make_request(rid: str, prompt: list[int], block_size: int = 16, **kw) -> Request:
    return Request(request_id=rid, prompt_token_ids=prompt, max_tokens=kw.pop("max_tokens", 16),
                   arrival_time=kw.pop("arrival_time", 0.0), hash_block_size=block_size, **kw)


def test_null_block_is_taken_at_start():
    pool = BlockPool(5, enable_caching=True)
    assert pool.null_block.block_id == 0
    assert pool.free_queue.block_ids() == [1, 2, 3, 4]


def test_free_queue_head_out_tail_in_middle_cut():
    pool = BlockPool(6, enable_caching=True)
    a, b, c = pool.get_new_blocks(3)
    assert [a.block_id, b.block_id, c.block_id] == [1, 2, 3]
    pool.free_blocks([c, b, a])
    assert pool.free_queue.block_ids() == [4, 5, 3, 2, 1]
    pool.touch([b])  # a hit on a free page cuts it out of the middle
    assert pool.free_queue.block_ids() == [4, 5, 3, 1]
    assert b.ref_cnt == 1


def test_vllm_test_suite_fact_prefix_hits_and_free_order():
    """vLLM's own test facts: 11 pages of 16, a 55-token prompt, a request sharing 3 pages."""
    kv = KVCacheManager(11, 16, max_model_len=1024, enable_caching=True, use_eagle=False)
    common = list(range(48))
    a = make_request("A", common + [100 + i for i in range(7)])
    hit, n = kv.get_computed_blocks(a)
    assert (hit, n) == (([],), 0)
    blocks = kv.allocate_slots(a, 55, n, hit)
    assert block_ids(blocks) == [[1, 2, 3, 4]]
    a.num_computed_tokens = 55

    b = make_request("B", common + [200 + i for i in range(5)])
    hit, n = kv.get_computed_blocks(b)
    assert block_ids(hit) == [[1, 2, 3]] and n == 48
    blocks = kv.allocate_slots(b, 5, n, hit)
    assert block_ids(blocks) == [[5]]
    b.num_computed_tokens = 53

    kv.free(a)
    kv.free(b)
    assert kv.pool.free_queue.block_ids() == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]


def test_hit_is_whole_blocks_and_leaves_the_last_token():
    kv = KVCacheManager(20, 4, max_model_len=256, enable_caching=True, use_eagle=False)
    a = make_request("A", list(range(8)), block_size=4)
    kv.allocate_slots(a, 8)
    twin = make_request("T", list(range(8)), block_size=4)  # same 8 tokens: at most 7 may hit
    assert kv.get_computed_blocks(twin)[1] == 4
    longer = make_request("L", list(range(10)), block_size=4)
    assert kv.get_computed_blocks(longer)[1] == 8


def test_eagle_drops_the_last_hit_block():
    kv = KVCacheManager(20, 4, max_model_len=256, enable_caching=True, use_eagle=True)
    kv.allocate_slots(make_request("A", list(range(12)), block_size=4), 12)
    assert kv.get_computed_blocks(make_request("B", list(range(13)), block_size=4))[1] == 8


def test_cache_salt_separates_prefixes():
    kv = KVCacheManager(20, 4, max_model_len=256, enable_caching=True, use_eagle=False)
    kv.allocate_slots(make_request("A", list(range(9)), block_size=4, cache_salt="x"), 9)
    assert kv.get_computed_blocks(make_request("B", list(range(9)), block_size=4))[1] == 0
    assert kv.get_computed_blocks(make_request("C", list(range(9)), block_size=4, cache_salt="x"))[1] == 8


def test_prompt_logprobs_get_no_hit():
    kv = KVCacheManager(20, 4, max_model_len=256, enable_caching=True, use_eagle=False)
    kv.allocate_slots(make_request("A", list(range(9)), block_size=4), 9)
    r = make_request("B", list(range(9)), block_size=4, wants_prompt_logprobs=True)
    assert kv.get_computed_blocks(r)[1] == 0


def test_reused_cached_page_loses_its_hash():
    events = []
    kv = KVCacheManager(3, 4, max_model_len=256, enable_caching=True, use_eagle=False,
                        emit=events.append)
    a = make_request("A", list(range(4)) + [9], block_size=4)
    kv.allocate_slots(a, 5)
    kv.free(a)
    b = make_request("B", [7, 7, 7, 7, 7], block_size=4)
    kv.allocate_slots(b, 5)  # takes both free pages: page 1 was cached
    assert [e.block_id for e in events if type(e).__name__ == "CachedBlockEvicted"] == [1]
    assert kv.get_computed_blocks(make_request("C", list(range(4)) + [1], block_size=4))[1] == 0


def test_allocation_refused_when_pool_is_short():
    kv = KVCacheManager(3, 4, max_model_len=256, enable_caching=False, use_eagle=False)
    assert kv.allocate_slots(make_request("A", list(range(9)), block_size=4), 9) is None
    assert kv.pool.num_free_blocks() == 2


def test_hits_on_free_pages_count_towards_allocation():
    kv = KVCacheManager(4, 4, max_model_len=256, enable_caching=True, use_eagle=False)
    a = make_request("A", list(range(9)), block_size=4)
    kv.allocate_slots(a, 9)
    kv.free(a)
    b = make_request("B", list(range(8)) + [5, 6, 7, 8, 9], block_size=4)
    hit, n = kv.get_computed_blocks(b)
    assert n == 8
    # 13 tokens need 4 pages: 2 hit (both free, so they count) + 2 new = 4 > 3 free
    assert kv.allocate_slots(b, 5, n, hit) is None


def test_reset_prefix_cache_refused_while_pages_are_used():
    kv = KVCacheManager(6, 4, max_model_len=256, enable_caching=True, use_eagle=False)
    a = make_request("A", list(range(8)), block_size=4)
    kv.allocate_slots(a, 8)
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert kv.get_computed_blocks(make_request("B", list(range(9)), block_size=4))[1] == 0


def test_zero_new_tokens_is_an_error():
    kv = KVCacheManager(6, 4, max_model_len=256, enable_caching=True, use_eagle=False)
    with pytest.raises(ValueError):
        kv.allocate_slots(make_request("A", [1], block_size=4), 0)


# -- KV cache events (reference.kv_events) ------------------------------------------------

def events_manager(num_blocks: int = 6, **kw) -> KVCacheManager:
    return KVCacheManager(num_blocks, 4, max_model_len=256, enable_caching=True, use_eagle=False,
                          enable_kv_cache_events=True, **kw)


def test_kv_events_stored_with_parent_and_new_tokens_only():
    kv = events_manager()
    r = make_request("a", list(range(1, 10)), block_size=4)
    kv.allocate_slots(r, 9)
    r.num_computed_tokens = 9
    (first,) = kv.take_events()
    assert isinstance(first, BlockStored)
    assert first.block_hashes == tuple(r.block_hashes[:2]) and first.parent_block_hash is None
    assert first.token_ids == tuple(range(1, 9)) and first.block_size == 4
    for t in (10, 11, 12):
        r.append_output_token(t)
    kv.allocate_slots(r, 3)
    (second,) = kv.take_events()
    assert second.block_hashes == (r.block_hashes[2],)
    assert second.parent_block_hash == r.block_hashes[1]
    assert second.token_ids == (9, 10, 11, 12)


def test_kv_events_removed_on_reuse_not_on_free_and_cleared_on_reset():
    kv = events_manager(num_blocks=4)  # 3 usable pages
    a = make_request("a", list(range(1, 10)), block_size=4)
    kv.allocate_slots(a, 9)
    kv.free(a)
    kv.take_events()
    assert kv.take_events() == []  # freeing announces nothing
    b = make_request("b", list(range(20, 29)), block_size=4)
    kv.allocate_slots(b, 9)
    removed = [e for e in kv.take_events() if isinstance(e, BlockRemoved)]
    assert [e.block_hashes for e in removed] == [(a.block_hashes[1],), (a.block_hashes[0],)]
    kv.free(b)
    assert kv.reset_prefix_cache()
    assert kv.take_events() == [AllBlocksCleared()]


def test_kv_events_off_queue_nothing():
    kv = KVCacheManager(6, 4, max_model_len=256, enable_caching=True, use_eagle=False)
    kv.allocate_slots(make_request("a", list(range(1, 10)), block_size=4), 9)
    assert kv.take_events() == []


def test_kv_events_with_an_adapter_raise_in_0_11_0_and_name_it_later():
    prompt = list(range(1, 10))
    with pytest.raises(AttributeError):
        events_manager().allocate_slots(make_request("a", prompt, block_size=4, lora_id=3), 9)
    kv = events_manager(has=lambda rule: rule == "kv_events_name_the_adapter")
    kv.allocate_slots(make_request("a", prompt, block_size=4, lora_id=3), 9)
    assert [e.lora_id for e in kv.take_events()] == [3]


def test_without_caching_freed_pages_join_the_tail_in_0_27_x():
    """no_caching_frees_to_the_tail (0.27.0 to 0.27.1): with prefix caching off, pages given
    back go to the tail; from 0.24.0 (every_uncached_page_reused_first) and again from
    0.28.0 to the head."""
    head = frozenset({"every_uncached_page_reused_first"})
    for rules, order in ((head, [3, 2, 1, 4, 5]),
                         (head | {"no_caching_frees_to_the_tail"}, [4, 5, 3, 2, 1])):
        has = Config(block_size=4, num_blocks=6, max_num_batched_tokens=8, max_num_seqs=1,
                     max_model_len=8, enable_prefix_caching=False, rules=rules).has
        pool = BlockPool(6, enable_caching=False, has=has)
        a, b, c = pool.get_new_blocks(3)
        pool.free_blocks([c, b, a])
        assert pool.free_queue.block_ids() == order, rules


def test_window_pages_wait_for_the_outputs_in_flight_from_0_26_0():
    """window_frees_wait_for_outputs: the pages a sliding window gives back before an
    allocation follow the tokens whose output is applied, not those of batches in flight."""
    from reference.kv_cache_spec import KVCacheSpec
    for rules, table in ((frozenset(), [0, 0, 3]),
                         (frozenset({"window_frees_wait_for_outputs"}), [0, 2, 3])):
        has = Config(block_size=4, num_blocks=8, max_num_batched_tokens=8, max_num_seqs=1,
                     max_model_len=32, rules=rules).has
        kv = KVCacheManager(8, 4, max_model_len=32, enable_caching=False, use_eagle=False,
                            groups=(KVCacheSpec("sliding_window", 4, sliding_window=4),), has=has)
        r = make_request("r", list(range(12)), block_size=4)
        kv.allocate_slots(r, 12)
        r.num_computed_tokens, r.num_in_flight_tokens = 12, 4  # one batch of 4 in flight
        kv.allocate_slots(r, 1)
        assert kv.get_block_ids("r")[0][:3] == table, rules


def test_a_lone_mamba_group_fails_the_start_up_from_0_23_0():
    """lone_group_must_divide_block_size: one Mamba group of 16-token pages, block size 4."""
    from reference.kv_cache_spec import KVCacheSpec
    for rules, fails in ((frozenset(), False),
                         (frozenset({"lone_group_must_divide_block_size"}), True)):
        has = Config(block_size=4, num_blocks=4, max_num_batched_tokens=8, max_num_seqs=1,
                     max_model_len=16, enable_prefix_caching=False, rules=rules).has
        try:
            KVCacheManager(4, 4, max_model_len=16, enable_caching=False, use_eagle=False,
                           groups=(KVCacheSpec("mamba", 16),), has=has)
        except AssertionError:
            assert fails, rules
        else:
            assert not fails, rules
