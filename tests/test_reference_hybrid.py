"""The reference's per-type managers and hybrid coordinator, on the facts vLLM 0.11.0's
own tests pin (tests/v1/core/test_single_type_kv_cache_manager.py and
test_prefix_caching.py, restated here on the reference; no vLLM needed)."""

from __future__ import annotations

import random

import pytest

from reference.block_pool import Block, BlockPool
from reference.group_managers import (ChunkedLocalAttentionManager, SlidingWindowManager,
                                      manager_for)
from reference.kv_cache_manager import KVCacheManager, block_ids
from reference.kv_cache_spec import CHUNKED_LOCAL, FULL, SLIDING_WINDOW, KVCacheSpec
from reference.request import Request


def cached_pool(pattern: list[bool]) -> tuple[BlockPool, list[bytes]]:
    """A pool where hash i is cached (group 0) in page i + 10 when pattern[i]."""
    pool = BlockPool(100, enable_caching=True)
    hashes = [bytes([i]) for i in range(len(pattern))]
    for i, cached in enumerate(pattern):
        if cached:
            pool.cache_full_blocks([hashes[i]], [pool.blocks[i + 10]], 0, 1, group_id=0)
    return pool, hashes


SLIDING_CASES = [
    ([False] * 10, 0), ([True], 1), ([True, False], 1), ([True, True], 2),
    ([True, True, False], 2), ([True, True, True], 3), ([True, True, True, False], 3),
    ([True, True, False, True, False, False, True, True, False, True, True, True], 12),
    ([True, True, False, True, False, False, True, True, False, False, False], 8),
    ([True, True, False, True, False, False, True, True, False, False, False, True], 8),
]


@pytest.mark.parametrize("pattern,expect", SLIDING_CASES)
def test_sliding_window_hit_is_found_from_the_right(pattern, expect):
    spec = KVCacheSpec(SLIDING_WINDOW, 2, sliding_window=4)  # 2 pages back to back
    pool, hashes = cached_pool(pattern)
    hit = SlidingWindowManager.find_longest_cache_hit(hashes, len(pattern) * 2, [0], pool, spec,
                                                      use_eagle=False)[0]
    assert len(hit) == expect
    assert all(b is pool.null_block for b in hit[:expect - 2])
    assert [b.block_id for b in hit[max(0, expect - 2):]] == \
        [i + 10 for i in range(max(0, expect - 2), expect)]


def _random_prefix(n: int) -> list[bool]:
    return [random.Random(n).random() < 0.5 for _ in range(n)]


CHUNKED_CASES = [
    ([True], 0, 1), ([True], 1, 1), ([True, False], 0, 2), ([True, False], 1, 2),
    ([True, True], 0, 2), ([True, True], 1, 2), ([True, True, False], 0, 2),
    ([True, True, False], 1, 2), ([True, True, True], 0, 3), ([True, True, True], 1, 3),
    ([True, True, True, False], 0, 4), ([True, True, True, False], 1, 4),
    (_random_prefix(8) + [True], 1, 9), (_random_prefix(8) + [False], 1, 8),
    (_random_prefix(8) + [True, True], 1, 10), (_random_prefix(8) + [True, False], 0, 10),
    (_random_prefix(8) + [True, False], 1, 10), (_random_prefix(8) + [False, True], 0, 10),
    (_random_prefix(8) + [False, True], 1, 10), (_random_prefix(8) + [False, False], 0, 10),
    (_random_prefix(8) + [False, False], 1, 10),
]


@pytest.mark.parametrize("pattern,tail,expect", CHUNKED_CASES)
def test_chunked_local_hit_counts_earlier_chunks_as_null(pattern, tail, expect):
    spec = KVCacheSpec(CHUNKED_LOCAL, 2, attention_chunk_size=4)
    pool, hashes = cached_pool(pattern)
    hit = ChunkedLocalAttentionManager.find_longest_cache_hit(
        hashes, len(pattern) * 2 + tail, [0], pool, spec, use_eagle=False)[0]
    assert len(hit) == expect
    assert all(b is pool.null_block for b in hit[:(expect - 1) // 2])


def table_of(manager, n: int = 11) -> list:
    """A table of n standalone pages (ids 1000..), as vLLM's test builds it."""
    table = manager.table("r")
    table.extend(Block(1000 + i) for i in range(n))
    manager.num_cached_block["r"] = 0
    return table


WINDOW = KVCacheSpec(SLIDING_WINDOW, 2, sliding_window=4)
CHUNK = KVCacheSpec(CHUNKED_LOCAL, 2, attention_chunk_size=4)


@pytest.mark.parametrize("spec,computed,nulls", [
    (WINDOW, 0, 0), (WINDOW, 4, 0), (WINDOW, 5, 1), (WINDOW, 6, 1), (WINDOW, 7, 2),
    (WINDOW, 11, 4), (CHUNK, 0, 0), (CHUNK, 4, 2), (CHUNK, 6, 2), (CHUNK, 12, 6)])
def test_pages_that_left_the_window_or_chunk_are_freed(spec, computed, nulls):
    pool = BlockPool(2000, enable_caching=True)
    manager = manager_for(spec, pool, 0)
    table = table_of(manager)
    manager.remove_skipped_blocks("r", computed)
    assert [b.block_id for b in table] == [0] * nulls + list(range(1000 + nulls, 1011))


def test_chunked_local_keeps_the_last_cached_page():
    pool = BlockPool(2000, enable_caching=True)
    manager = manager_for(KVCacheSpec(CHUNKED_LOCAL, 2, attention_chunk_size=4), pool, 0)
    table = table_of(manager)
    manager.num_cached_block["r"] = 2  # pages 0 and 1 are cached: page 1 stays
    manager.remove_skipped_blocks("r", 12)
    assert [b.block_id for b in table[:3]] == [0, 1001, 1002]


@pytest.mark.parametrize("kind,param", [(SLIDING_WINDOW, "sliding_window"),
                                        (CHUNKED_LOCAL, "attention_chunk_size")])
def test_free_hit_pages_count_and_null_pages_do_not(kind, param):
    pool = BlockPool(100, enable_caching=True)
    manager = manager_for(KVCacheSpec(kind, 2, **{param: 4}), pool, 0)
    free_hits = pool.blocks[10:20]
    assert manager.pages_to_allocate("r", 40, free_hits) == 20
    assert manager.pages_to_allocate("r", 40, [pool.null_block] * 5 + free_hits[:5]) == 15


def request(rid: str, prompt: list[int]) -> Request:
    return Request(request_id=rid, prompt_token_ids=prompt, max_tokens=8, arrival_time=0.0,
                   hash_block_size=16)


def test_hybrid_hit_of_vllm_test_prefill_hybrid_model():
    groups = (KVCacheSpec(FULL, 16), KVCacheSpec(SLIDING_WINDOW, 16, sliding_window=32),
              KVCacheSpec(SLIDING_WINDOW, 16, sliding_window=32))
    kv = KVCacheManager(21, 16, max_model_len=8192, enable_caching=True, use_eagle=False,
                        groups=groups)
    common = [0] * 16 + [1] * 16 + [2] * 16
    a = request("0", common + [3] * 7)
    hits, n = kv.get_computed_blocks(a)
    assert n == 0
    assert block_ids(kv.allocate_slots(a, 55, n, hits)) == [[1, 2, 3, 4], [5, 6, 7, 8],
                                                            [9, 10, 11, 12]]
    b = request("1", common + [3] * 5)
    hits, n = kv.get_computed_blocks(b)
    assert block_ids(hits) == [[1, 2, 3], [0, 6, 7], [0, 10, 11]] and n == 48
    assert block_ids(kv.allocate_slots(b, 5, n, hits)) == [[13], [14], [15]]
    assert all(blk.ref_cnt == 2 for hit in hits for blk in hit if not blk.is_null)


def test_eagle_needs_one_window_page_more_and_drops_it():
    groups = (KVCacheSpec(SLIDING_WINDOW, 16, sliding_window=16),)
    kv = KVCacheManager(10, 16, max_model_len=8192, enable_caching=True, use_eagle=True,
                        groups=groups)
    a = request("a", [0] * 37)
    kv.allocate_slots(a, 37)
    kv.free(a)
    hits, n = kv.get_computed_blocks(request("b", [0] * 37))
    assert n == 16 and len(hits[0]) == 1


def test_the_whole_sequence_test_caps_a_chunked_local_group_from_0_20_2():
    """window_admission_capped, and from 0.26.0 window_cap_counts_batches_in_flight: 9
    tokens need 3 full-attention pages and, uncapped, 3 chunked-local ones (6 > 5 free);
    capped, a 4-token chunk and a 3-token budget take 2 pages (5 fit), while two batches
    in flight (async scheduling) take 3 again."""
    from reference.config import Config
    from reference.kv_cache_spec import KVCacheSpec
    from reference.request import Request
    from reference.scheduler import Scheduler
    whole = frozenset({"admission_reserves_whole_sequence"})
    capped = whole | {"window_admission_capped"}
    in_flight = capped | {"window_cap_counts_batches_in_flight"}
    for rules, async_scheduling, admitted in ((whole, False, False), (capped, False, True),
                                              (in_flight, False, True),
                                              (in_flight, True, False)):
        s = Scheduler(Config(block_size=4, num_blocks=6, max_num_batched_tokens=3,
                             max_num_seqs=1, max_model_len=16, rules=rules,
                             async_scheduling=async_scheduling,
                             kv_cache_groups=(KVCacheSpec("full", 4),
                                              KVCacheSpec("chunked_local", 4,
                                                          attention_chunk_size=4))))
        s.add_request(Request(request_id="r", prompt_token_ids=list(range(9)), max_tokens=1,
                              arrival_time=0.0, hash_block_size=4))
        assert bool(s.schedule().num_scheduled_tokens) == admitted, (rules, async_scheduling)


def paged(rid: str, prompt: list[int]) -> Request:
    return Request(request_id=rid, prompt_token_ids=prompt, max_tokens=8, arrival_time=0.0,
                   hash_block_size=4)


def _window_hybrid(rules: set[str], use_eagle: bool = False) -> KVCacheManager:
    """Full attention plus a sliding window of 8 tokens over pages of 4 (a hit needs 2 pages),
    prefix caching on, with ``rules`` of later releases."""
    groups = (KVCacheSpec(FULL, 4), KVCacheSpec(SLIDING_WINDOW, 4, sliding_window=8))
    return KVCacheManager(60, 4, max_model_len=64, enable_caching=True, use_eagle=use_eagle,
                          groups=groups, has=lambda name: name in rules)


def _indexed_window_pages(kv: KVCacheManager, r: Request) -> list[int]:
    table = kv.coordinator.managers[1].req_to_blocks[r.request_id]
    return [i for i, page in enumerate(table) if page.block_hash is not None]


def _run_alone(kv: KVCacheManager, r: Request) -> list[int]:
    """Admit ``r`` with its hit and compute its whole prompt; the window pages it indexed."""
    hits, n = kv.get_computed_blocks(r)
    kv.allocate_slots(r, len(r.prompt_token_ids) - n, n, hits)
    return _indexed_window_pages(kv, r)


def test_window_pages_indexed_only_before_the_resume_points_from_0_29_0():
    """window_pages_cached_sparsely: a 24-token prompt indexes every full window page up to
    0.28.0; from 0.29.0 only the 2 ending at the page boundary at or before token 23."""
    assert _run_alone(_window_hybrid(set()), paged("a", list(range(24)))) == [0, 1, 2, 3, 4, 5]
    sparse = _window_hybrid({"window_pages_cached_sparsely"})
    assert _run_alone(sparse, paged("a", list(range(24)))) == [3, 4]


def test_a_cut_hit_marks_the_shared_prefix_whose_window_pages_are_indexed():
    """b shares a's first 16 tokens: the full group hits 16, the window group (only a's pages
    3-4 indexed) nothing; b's shared prefix is 16 and its window pages 2-3 end there."""
    kv = _window_hybrid({"window_pages_cached_sparsely"})
    _run_alone(kv, paged("a", list(range(24))))
    b = paged("b", list(range(16)) + [90, 91, 92, 93, 94])
    assert _run_alone(kv, b) == [2, 3, 4] and b.shared_prefix_boundary == 16
    c = paged("c", list(range(16)) + [80, 81])
    hits, n = kv.get_computed_blocks(c)
    assert n == 16 and c.shared_prefix_boundary == 0


def test_eagle_window_pages_at_the_replay_hits_from_0_30_0():
    """A 16-token prompt with an eagle drafter (3 window pages, one dropped): 0.29.0 keeps
    the pages ending one past the boundary at or before token 15 (pages 1-3); 0.30.0 those
    ending one past 8 and past 12 (pages 0-3), where a resend and an extension resume."""
    sparse = {"window_pages_cached_sparsely"}
    a = paged("a", list(range(16)))
    assert _run_alone(_window_hybrid(sparse, use_eagle=True), a) == [1, 2, 3]
    a = paged("a", list(range(16)))
    assert _run_alone(_window_hybrid(sparse | {"eagle_window_tails_at_replay_hits"},
                                     use_eagle=True), a) == [0, 1, 2, 3]


def test_eagle_hybrid_search_reaches_the_last_key_from_0_32_0():
    """The same 16-token prompt sent again with an eagle drafter (0.20.0's one drop between
    the groups): the search stops at token 15 and drops a page (8 tokens); from 0.32.0 it
    reaches token 16 and drops one (12)."""
    once = {"hybrid_eagle_drop_once_per_group"}
    for rules, expect in ((once, 8), (once | {"eagle_search_reaches_the_last_key"}, 12)):
        kv = _window_hybrid(rules, use_eagle=True)
        _run_alone(kv, paged("a", list(range(16))))
        assert kv.get_computed_blocks(paged("b", list(range(16))))[1] == expect
