"""The pages of one KV cache group, per attention type.

Mirrors: vllm/v1/core/single_type_kv_cache_manager.py (SingleTypeKVCacheManager,
FullAttentionManager, SlidingWindowManager, ChunkedLocalAttentionManager,
MambaManager).

Each group keeps one block table per request: page ``i`` holds tokens
``i * block_size .. (i + 1) * block_size - 1`` of that group's layers.  The
types differ in three rules:

* which pages a prefix hit may use (``find_longest_cache_hit``): full
  attention needs every leading page; a sliding window needs only the pages
  its window still sees, found from the right; chunked local attention needs
  only the pages of the current chunk; Mamba never hits;
* which pages a running request can give back (``remove_skipped_blocks``):
  pages that fell out of the window or the chunk are freed and replaced by
  the null page, so the table keeps its length;
* how many pages a request needs: one per ``block_size`` tokens, except
  Mamba, whose one page holds the whole request, plus one per draft.
"""

from __future__ import annotations


from reference.arith import cdiv
from reference.block_hash import BlockHash
from reference.block_pool import Block, BlockPool
from reference.releases import HasRule, only_0_11_0
from reference.kv_cache_spec import CHUNKED_LOCAL, FULL, MAMBA, SLIDING_WINDOW, KVCacheSpec
from reference.request import Request

#: One list of pages per group in a lookup: hits for several groups of one type at once.
GroupHits = list[list[Block]]

class GroupManager:
    """Block tables of one group (vLLM's SingleTypeKVCacheManager)."""

    def __init__(self, spec: KVCacheSpec, pool: BlockPool, group_id: int,
                 has: HasRule = only_0_11_0):
        self.spec = spec
        self.has = has
        self.block_size = spec.block_size
        self.pool = pool
        self.group_id = group_id
        self.req_to_blocks: dict[str, list[Block]] = {}
        # Full pages of each running request already indexed in the cache.
        self.num_cached_block: dict[str, int] = {}
        self.use_eagle = False  # set by the coordinator

    def table(self, request_id: str) -> list[Block]:
        return self.req_to_blocks.setdefault(request_id, [])

    # -- how many pages ------------------------------------------------------------

    def pages_to_allocate(self, request_id: str, num_tokens: int, hit: list[Block],
                          num_computed_tokens: int = 0,
                          admission: tuple[int, int] | None = None) -> int:
        """Pages to take from the free queue for ``num_tokens`` slots in all.

        Up to 0.13.0 the count may be negative (a table can be longer than needed
        once rejected drafts are taken back), and the groups' counts are added up.
        Prefix-hit pages sitting in the free queue count, since taking them shrinks
        the free queue too.  From 0.14.0 (window_hits_skipped_at_admission) a group
        never counts below zero, and a new request's hit pages that lie before the
        window of its ``num_computed_tokens`` (hit and loaded) are neither needed nor
        taken.  ``admission`` (tokens in flight, max_model_len), given by the
        whole-sequence admission test from 0.20.2 (window_admission_capped), caps a window
        group's need at the pages one request can hold at once (:meth:`admission_cap`).
        """
        needed = cdiv(self.slots_needed(num_tokens), self.block_size)
        if admission is not None:
            cap = self.admission_cap(*admission)
            needed = needed if cap is None else min(needed, cap)
        table = self.table(request_id)
        if not self.has("window_hits_skipped_at_admission"):
            return needed - len(hit) - len(table) + self.free_hit_pages(hit)
        if request_id in self.num_cached_block:  # running: no new hit
            return max(needed - len(table), 0)
        skipped = self.num_skipped_tokens(num_computed_tokens) // self.block_size
        new = max(needed - max(skipped, len(hit) + len(table)), 0)
        return new + self.free_hit_pages(hit[max(0, skipped - len(table)):])

    def has_room(self, request_id: str, num_tokens: int) -> bool:
        """A running request's table has slots for ``num_tokens`` already."""
        return (request_id in self.num_cached_block and
                cdiv(self.slots_needed(num_tokens), self.block_size) <= len(self.table(request_id)))

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens the next token no longer attends to: none for full attention."""
        return 0

    def admission_cap(self, tokens_in_flight: int, max_model_len: int) -> int | None:
        """The most pages a request holds at once in this group while ``tokens_in_flight``
        tokens are being computed (never more than ``max_model_len`` tokens); None: no
        cap (a group that gives no pages back)."""
        return None

    def slots_needed(self, num_tokens: int) -> int:
        return num_tokens

    def free_hit_pages(self, hit: list[Block]) -> int:
        """Hit pages sitting in the free queue (the null page never does)."""
        return sum(1 for b in hit if b.ref_cnt == 0 and not b.is_null)

    # -- growing a table -------------------------------------------------------------

    def save_hit(self, request_id: str, hit: list[Block], num_computed_tokens: int = 0) -> None:
        """A newly admitted request starts its table with its prefix-hit pages.

        From 0.14.0 (window_hits_skipped_at_admission) the hit pages before the window
        of the ``num_computed_tokens`` are not taken: null pages stand in their place,
        and the pages stay where they are in the free queue.  The rest are touched here.
        """
        if request_id in self.num_cached_block:
            assert not hit, "a running request cannot gain prefix hits"
            return
        table = self.table(request_id)
        assert not table
        if self.has("window_hits_skipped_at_admission"):
            skipped = self.num_skipped_tokens(num_computed_tokens) // self.block_size
            hit = [self.pool.null_block] * skipped + self.touched(hit[skipped:])
        table.extend(hit)
        self.num_cached_block[request_id] = len(table)

    def touched(self, hit: list[Block]) -> list[Block]:
        if self.pool.enable_caching:
            self.pool.touch(hit)
        return hit

    def grow(self, request_id: str, num_tokens: int) -> list[Block]:
        """Append new pages until the table has slots for ``num_tokens`` tokens."""
        table = self.table(request_id)
        missing = cdiv(self.slots_needed(num_tokens), self.block_size) - len(table)
        if missing <= 0:
            return []
        new_blocks = self.pool.get_new_blocks(missing)
        table.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Index the request's pages that ``num_tokens`` fill completely, as far as the
        request's keys reach (from 0.33.0 an eagle request's last full page may wait for
        the token after it: eagle_hashes_cover_the_next_token)."""
        num_full = min(num_tokens, hashed_tokens(request)) // self.block_size
        num_cached = self.num_cached_block[request.request_id]
        if num_full == num_cached:
            return  # no page filled up since the last call (most decode steps)
        self.pool.cache_full_blocks(request.block_hashes, self.table(request.request_id),
                                    num_cached, num_full, self.group_id, request,
                                    self.block_size,
                                    indexed=self.pages_indexed(request, num_cached, num_full))
        self.num_cached_block[request.request_id] = num_full

    def pages_indexed(self, request: Request, num_cached: int, num_full: int) -> range | set[int]:
        """Which of the newly full pages ``num_cached .. num_full - 1`` are indexed; a page
        left out is passed over like a null page, for good."""
        return range(num_cached, num_full) if self.indexes_pages() else range(0)

    def indexes_pages(self) -> bool:
        """Whether full pages are indexed in the prefix cache (every type but one case)."""
        return True

    # -- giving pages back -------------------------------------------------------------

    def free(self, request_id: str) -> None:
        """Return the request's pages to the pool."""
        table = self.req_to_blocks.pop(request_id, [])
        self.pool.free_blocks(self.free_order(table))
        self.num_cached_block.pop(request_id, None)

    def free_order(self, table: list[Block]):
        """Tail first, so that a request's tail is evicted before its shared prefix."""
        return reversed(table)

    #: Whether the group's window lets it give pages back while the request runs.
    gives_pages_back = False

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Full attention and Mamba keep every page while the request runs."""

    def null_out_before(self, request_id: str, first_kept: int) -> None:
        """Free the pages before index ``first_kept`` and put the null page in their place.

        It walks back from ``first_kept - 1`` and stops at the first null page:
        the pages before it were nulled by an earlier call.

        Up to 0.13.0 a table shorter than ``first_kept`` is indexed past its end and
        the step raises ``IndexError``, as vLLM's does: a priority victim that resumes
        with its stale grant and no pages meets it (quirks.PRIORITY_VICTIM_KEEPS_ITS_GRANT).
        From 0.14.0 (window_hits_skipped_at_admission) the walk starts inside the table,
        since the window may now reach into tokens loaded from outside that have no
        pages yet.
        """
        table = self.table(request_id)
        if self.has("window_hits_skipped_at_admission"):
            first_kept = min(first_kept, len(table))
        removed = []
        for i in range(first_kept - 1, -1, -1):
            if table[i] is self.pool.null_block:
                break
            removed.append(table[i])
            table[i] = self.pool.null_block
        self.give_back(removed)

    def give_back(self, pages: list[Block]) -> None:
        """Pages a request no longer needs, in the order they should be reused.  From
        0.23.0 (uncached_pages_reused_first) the uncached ones among them go to the head
        of the free queue, to be reused before any cached page is evicted; the cached ones
        join the tail as before."""
        self.pool.free_blocks(pages, uncached_first=self.has("uncached_pages_reused_first"))

    # -- prefix lookup ------------------------------------------------------------------

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: list[BlockHash], max_length: int,
                               group_ids: list[int], pool: BlockPool, spec: KVCacheSpec,
                               use_eagle: bool) -> GroupHits:
        raise NotImplementedError


def trim_hit_for_eagle(hits: GroupHits, use_eagle: bool) -> None:
    """Eagle needs the hidden states of the last hit page: it is recomputed."""
    if use_eagle and hits[0]:
        for hit in hits:
            hit.pop()


class FullAttentionManager(GroupManager):
    """Every token is attended to: a hit is the run of cached leading pages."""

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, pool, spec, use_eagle):
        """Leading cached pages, whole pages only, covering at most ``max_length`` tokens."""
        hits: GroupHits = [[] for _ in group_ids]
        for block_hash in block_hashes[:max_length // spec.block_size]:
            cached = pool.get_cached_block(block_hash, group_ids)
            if cached is None:
                break  # the hashes are chained: nothing after a miss can hit
            for hit, block in zip(hits, cached):
                hit.append(block)
        trim_hit_for_eagle(hits, use_eagle)
        return hits


class SlidingWindowManager(GroupManager):
    """A token attends to the ``sliding_window`` tokens ending at it."""

    gives_pages_back = True

    def admission_cap(self, tokens_in_flight: int, max_model_len: int) -> int | None:
        """The window's earlier tokens and those in flight, one page more for a window
        that does not start on a page boundary."""
        tokens = min(self.spec.sliding_window - 1 + tokens_in_flight, max_model_len)
        return cdiv(tokens, self.block_size) + 1

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, pool, spec, use_eagle):
        """The rightmost run of cached pages long enough to fill the window; nulls before it.

        The next token sees ``sliding_window - 1`` earlier tokens, so that many
        tokens' pages must be cached back to back; eagle needs one page more,
        which it then drops.  The search goes from the right and stops at the
        first run long enough.  Without one, the run of cached pages at the very
        start is the hit, however short.
        """
        needed = window_pages(spec) + (1 if use_eagle else 0)
        num_pages = max_length // spec.block_size
        hits: GroupHits = [[pool.null_block] * num_pages for _ in group_ids]
        run = 0
        found = False
        for i in range(num_pages - 1, -1, -1):
            cached = pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                run = 0
                continue
            for hit, block in zip(hits, cached):
                hit[i] = block
            run += 1
            if run >= needed:
                for hit in hits:
                    del hit[i + run:]  # the pages right of the run are not hits
                found = True
                break
        if not found:
            for hit in hits:
                del hit[run:]
        trim_hit_for_eagle(hits, use_eagle)
        return hits

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Pages whose tokens all lie before the window of the next token are given back."""
        self.null_out_before(request_id,
                             self.num_skipped_tokens(num_computed_tokens) // self.block_size)

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The next token sees the ``sliding_window`` tokens ending at it."""
        return max(0, num_computed_tokens - self.spec.sliding_window + 1)

    def pages_indexed(self, request: Request, num_cached: int, num_full: int) -> range | set[int]:
        """From 0.29.0 (window_pages_cached_sparsely; vLLM's default
        ``prefix_cache_retention_interval`` of 0) only the pages a later hit can start from
        are indexed: for each point a later hit can end at, the window's pages that end at
        the page boundary at or before it (eagle: one page more, and one page further on,
        the page its hit drops).  The points are where a request with the same prompt
        resumes (:meth:`replay_points`) and the request's shared prefix.  Every other page
        is left out."""
        if num_cached >= num_full or not self.indexes_pages() \
                or not self.has("window_pages_cached_sparsely"):
            return super().pages_indexed(request, num_cached, num_full)
        eagle = 1 if self.use_eagle else 0
        needed = window_pages(self.spec) + eagle
        kept: set[int] = set()
        for resume_point in self.replay_points(request) + shared_prefix(request):
            end = resume_point // self.block_size + eagle
            kept.update(range(max(num_cached, end - needed), min(num_full, end)))
        return kept

    def replay_points(self, request: Request) -> list[int]:
        """Where a later request with this prompt resumes: after its hit, which stops short
        of the last prompt token.  From 0.30.0 (eagle_window_tails_at_replay_hits), with an
        eagle drafter, the two hits that drop their last page: one page below the last page
        boundary at or before the last prompt token (the same prompt sent again) and one
        below the boundary at or before the prompt's end (a longer prompt)."""
        last = len(request.prompt_token_ids) - 1
        if not self.use_eagle or not self.has("eagle_window_tails_at_replay_hits"):
            return [last]
        page = self.block_size
        resend, extension = last // page * page, (last + 1) // page * page
        return sorted({max(resend - page, 0), max(extension - page, 0)})

    def indexes_pages(self) -> bool:
        """From 0.23.0 (window_of_one_indexes_nothing) a window of one token, without an
        eagle drafter, indexes none of its pages: no hit could ever need an earlier page
        of this group."""
        return not (self.has("window_of_one_indexes_nothing") and self.spec.sliding_window == 1
                    and not self.use_eagle)

    def free(self, request_id: str) -> None:
        """A finished or preempted request's pages, tail first; from 0.23.0 the uncached
        ones go to the head of the free queue (``give_back``)."""
        table = self.req_to_blocks.pop(request_id, [])
        self.give_back(list(reversed(table)))
        self.num_cached_block.pop(request_id, None)


def shared_prefix(request: Request) -> list[int]:
    """The end of the full-attention hit the window groups cut short at the request's
    lookup, if they did (from 0.29.0): a later request with that prefix resumes there."""
    return [request.shared_prefix_boundary] if request.shared_prefix_boundary else []


def window_pages(spec: KVCacheSpec) -> int:
    """Pages that hold the ``sliding_window - 1`` tokens before the next one, at most."""
    return cdiv(spec.sliding_window - 1, spec.block_size)


class ChunkedLocalAttentionManager(GroupManager):
    """A token attends only to the tokens of its chunk of ``attention_chunk_size``."""

    gives_pages_back = True

    def admission_cap(self, tokens_in_flight: int, max_model_len: int) -> int | None:
        """A chunk and the tokens in flight."""
        tokens = min(self.spec.attention_chunk_size + tokens_in_flight, max_model_len)
        return cdiv(tokens, self.block_size)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, pool, spec, use_eagle):
        """Null pages up to the chunk of the next token, then its cached pages in that chunk.

        The pages of earlier chunks are never read again, so they count as hit
        without being cached.  Eagle is refused (vLLM asserts it is off).
        """
        assert not use_eagle, "eagle is not supported with chunked local attention groups"
        num_pages = max_length // spec.block_size
        chunk_start = max_length // spec.attention_chunk_size * spec.attention_chunk_size
        first_page = chunk_start // spec.block_size
        hits: GroupHits = [[pool.null_block] * first_page for _ in group_ids]
        for i in range(first_page, num_pages):
            cached = pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                break
            for hit, block in zip(hits, cached):
                hit.append(block)
        return hits

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Pages before the chunk of the next token are given back.

        0.11.0 keeps the last cached page even so (its hash is the parent of
        the next page's); from 0.11.1 it goes too.
        """
        first_kept = self.num_skipped_tokens(num_computed_tokens) // self.block_size
        num_cached = self.num_cached_block.get(request_id, 0)
        if num_cached > 0 and not self.has("chunked_local_frees_last_cached_page"):
            first_kept = min(first_kept, num_cached - 1)
        self.null_out_before(request_id, first_kept)

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The next token sees only its own chunk."""
        return num_computed_tokens // self.spec.attention_chunk_size * self.spec.attention_chunk_size


class MambaManager(GroupManager):
    """A Mamba layer keeps a fixed-size state: one page per request, plus one per draft."""

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, pool, spec, use_eagle):
        """0.11.0 has no prefix caching for Mamba states: never a hit."""
        return [[] for _ in group_ids]

    def slots_needed(self, num_tokens: int) -> int:
        """The drafts' states need pages of their own."""
        return num_tokens + self.block_size * self.spec.num_speculative_blocks


MANAGERS: dict[str, type[GroupManager]] = {
    FULL: FullAttentionManager,
    SLIDING_WINDOW: SlidingWindowManager,
    CHUNKED_LOCAL: ChunkedLocalAttentionManager,
    MAMBA: MambaManager,
}


def manager_for(spec: KVCacheSpec, pool: BlockPool, group_id: int,
                has: HasRule = only_0_11_0) -> GroupManager:
    return MANAGERS[spec.kind](spec, pool, group_id, has)


def hashed_tokens(request: Request) -> int:
    """The tokens the request's block keys cover."""
    return len(request.block_hashes) * (request.hash_block_size or 0)
