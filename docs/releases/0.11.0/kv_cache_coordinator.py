"""Several KV cache groups over one pool: page counts add up, prefix hits must agree.

Mirrors: vllm/v1/core/kv_cache_coordinator.py (KVCacheCoordinator,
KVCacheCoordinatorNoPrefixCache, UnitaryKVCacheCoordinator,
HybridKVCacheCoordinator).

Every group keeps its own block table for a request, and all of them draw
from the one pool, so a request needs the sum of the pages its groups need.
A prefix hit must be usable by every group at once.  vLLM 0.11.0 finds one
only for one group, or for full-attention groups plus groups of exactly one
other type; prefix caching with any other mix is refused at start-up (the
stream checks refuse those streams before any engine runs).
"""

from __future__ import annotations

from reference.block_hash import BlockHash
from reference.block_pool import Block, BlockPool
from reference.group_managers import GroupHits, manager_for
from reference.kv_cache_spec import KVCacheSpec
from reference.request import Request

#: One list of pages per group, in group order.
PerGroup = tuple[list[Block], ...]


class KVCacheCoordinator:
    """All groups' managers; the lookup that suits the groups is picked at start."""

    def __init__(self, specs: tuple[KVCacheSpec, ...], pool: BlockPool, enable_caching: bool,
                 use_eagle: bool):
        self.specs = specs
        self.pool = pool
        self.use_eagle = use_eagle
        self.managers = tuple(manager_for(spec, pool, i) for i, spec in enumerate(specs))
        for m in self.managers:
            m.use_eagle = use_eagle
        # The managers whose window lets them give pages back as a request runs.
        self.windowed = tuple(m for m in self.managers if m.gives_pages_back)
        # What a request that takes no page gets: no page in any group (read, never changed).
        self.no_pages: PerGroup = tuple([] for _ in self.managers)
        self.is_hybrid = enable_caching and len(specs) > 1
        if not enable_caching:
            self.lookup = self.no_hit
        elif len(specs) == 1:
            self.lookup = self.one_group_hit
        else:
            self.full_ids, self.other_ids = split_groups(specs)
            self.lookup = self.hybrid_hit

    def empty(self) -> PerGroup:
        return tuple([[] for _ in self.managers])

    # -- every group in turn ----------------------------------------------------------

    def pages_to_allocate(self, request_id: str, num_tokens: int, hits: PerGroup,
                          num_computed_tokens: int = 0,
                          admission: tuple[int, int] | None = None) -> int:
        """The groups' counts added up (negative ones included, up to 0.13.0)."""
        total = 0
        for m, hit in zip(self.managers, hits):
            total += m.pages_to_allocate(request_id, num_tokens, hit, num_computed_tokens,
                                         admission)
        return total

    def has_room(self, request_id: str, num_tokens: int) -> bool:
        """The request runs and every group's table has slots for ``num_tokens`` already."""
        for m in self.managers:
            if not m.has_room(request_id, num_tokens):
                return False
        return True

    def save_hits(self, request_id: str, hits: PerGroup, num_computed_tokens: int = 0) -> None:
        for m, hit in zip(self.managers, hits):
            m.save_hit(request_id, hit, num_computed_tokens)

    def grow(self, request_id: str, num_tokens: int) -> PerGroup:
        grown = []
        for m in self.managers:
            grown.append(m.grow(request_id, num_tokens))
        return tuple(grown)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        for m in self.managers:
            m.cache_blocks(request, num_tokens)

    def free(self, request_id: str) -> None:
        """Group by group, in group order: group 0's pages reach the free queue first."""
        for m in self.managers:
            m.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for m in self.windowed:
            m.remove_skipped_blocks(request_id, num_computed_tokens)

    def tables(self, request_id: str) -> PerGroup:
        return tuple(m.req_to_blocks.get(request_id) or [] for m in self.managers)

    # -- prefix lookup --------------------------------------------------------------------

    def no_hit(self, block_hashes: list[BlockHash], max_length: int) -> tuple[PerGroup, int]:
        """Prefix caching off."""
        return self.empty(), 0

    def one_group_hit(self, block_hashes: list[BlockHash], max_length: int) -> tuple[PerGroup, int]:
        manager = self.managers[0]
        hits = manager.find_longest_cache_hit(block_hashes, max_length, [0], self.pool,
                                              manager.spec, self.use_eagle)
        return tuple(hits), len(hits[0]) * manager.block_size

    def hybrid_hit(self, block_hashes: list[BlockHash], max_length: int) -> tuple[PerGroup, int]:
        """Full attention first; then the other type, inside the full hit; then the full
        hit is cut to the other's length, so that both cover the same tokens.

        0.14.0 to 0.15.0 (``hybrid_hit_searched_until_groups_agree``) search again, in
        rounds, until a round shortens nothing: the full hit is only cut, the other type
        is searched again inside the hit so far.  Without an eagle drafter the second
        search finds the same hit.  With one, every search gives up its last page again,
        so the hit shrinks a page a round, mostly to nothing.

        From 0.20.0 (``hybrid_eagle_drop_once_per_group``), with an eagle drafter, the
        other type looks one of its pages past the full hit (never past ``max_length``)
        before it gives up its own last page, so the two types lose one page between
        them instead of one each.  vLLM applies this to the groups it marks as the
        drafter's; the harness marks none, and then vLLM counts every group as one.
        """
        full = self.managers[self.full_ids[0]]
        other = self.managers[self.other_ids[0]]
        full_hits = self.full_groups_hit(block_hashes, max_length)
        hit_length = len(full_hits[0]) * full.block_size
        other_hits = other.find_longest_cache_hit(block_hashes, hit_length, self.other_ids,
                                                  self.pool, other.spec, self.use_eagle)
        hit_length = len(other_hits[0]) * other.block_size
        bound = max_length
        while False:
            bound = hit_length
            other_hits = other.find_longest_cache_hit(block_hashes, bound, self.other_ids,
                                                      self.pool, other.spec, self.use_eagle)
            hit_length = len(other_hits[0]) * other.block_size
        for hit in full_hits:
            del hit[hit_length // full.block_size:]
        return merge_in_group_order(self.full_ids, full_hits, self.other_ids, other_hits), hit_length

    def full_groups_hit(self, block_hashes: list[BlockHash], max_length: int) -> GroupHits:
        """The full-attention groups' own hit, searched first; with an eagle drafter up to
        :meth:`eagle_search_end`, before its last page is dropped."""
        full = self.managers[self.full_ids[0]]
        end = self.eagle_search_end(block_hashes, max_length) if self.use_eagle else max_length
        return full.find_longest_cache_hit(block_hashes, end, self.full_ids, self.pool,
                                           full.spec, self.use_eagle)

    def eagle_search_end(self, block_hashes: list[BlockHash], max_length: int) -> int:
        """How far a hybrid search for an eagle drafter looks before dropping a page: up to
        ``max_length``; from 0.32.0 (eagle_search_reaches_the_last_key) up to the last page
        the request's keys cover, so that a prompt of whole pages sent again hits all but
        its last page, not all but two."""
        return max_length


def split_groups(specs: tuple[KVCacheSpec, ...]) -> tuple[list[int], list[int]]:
    """Ids of the full-attention groups and of the others.

    The stream checks guarantee what vLLM asserts here: one spec among the
    full groups, one among the others, and the two kinds not interleaved.
    """
    full_ids = [i for i, s in enumerate(specs) if s.is_full]
    other_ids = [i for i, s in enumerate(specs) if not s.is_full]
    assert full_ids and other_ids, "prefix caching over several groups needs full attention"
    assert len({specs[i] for i in other_ids}) == 1, "one other type of group"
    return full_ids, other_ids


def merge_in_group_order(full_ids: list[int], full_hits: GroupHits,
                         other_ids: list[int], other_hits: GroupHits) -> PerGroup:
    by_group = dict(zip(full_ids, full_hits)) | dict(zip(other_ids, other_hits))
    return tuple(by_group[i] for i in sorted(by_group))
