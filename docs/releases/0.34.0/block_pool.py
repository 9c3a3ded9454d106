"""The page pool: every KV page, the free queue, and the prefix-cache index.

Mirrors: vllm/v1/core/block_pool.py (BlockPool, BlockHashToBlockMap) and
vllm/v1/core/kv_cache_utils.py (KVCacheBlock, FreeKVCacheBlockQueue).

Pages are bought once: ids ``0 .. num_blocks - 1``.  Page 0 is the null page,
taken out of the free queue at start and never handed out or freed.  A free
page may still be *cached*: it keeps its hash and can be hit until it is
handed out again, at which point its hash is dropped (eviction).  With
several KV cache groups a page is cached under its hash *and* its group: the
same tokens have one page per group, and a hit needs all of them.

The free queue's order is the eviction order: new pages come from the head,
freed pages go to the tail, a cache hit on a free page cuts it out of the
middle.  Every operation is O(1) per page: the queue is a doubly linked list
threaded through the pages themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from reference import events
from reference.block_hash import BlockHash
from reference.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventQueue

if TYPE_CHECKING:
    from reference.request import Request

#: A page is cached under the hash of its tokens and the id of its KV cache group.
CacheKey = tuple[BlockHash, int]


class Block:
    """One KV page."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "is_null")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0  # requests holding this page
        self.block_hash: CacheKey | None = None  # set while the page is cached
        self.prev_free: Block | None = None
        self.next_free: Block | None = None
        self.is_null = False

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Free pages in eviction order, linked through the pages (head = next to go)."""

    def __init__(self, blocks: list[Block]):
        self._head = Block(-1)  # sentinels: every real page in the queue has neighbours
        self._tail = Block(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        self.append_n(blocks)

    def popleft_n(self, n: int) -> list[Block]:
        """Take ``n`` pages from the head."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot take {n} pages, {self.num_free_blocks} free")
        taken = []
        for _ in range(n):
            block = self.next_to_go()
            self._unlink(block)
            taken.append(block)
        return taken

    def next_to_go(self) -> Block:
        """The head: the page freed longest ago, so the least recently used."""
        return self._head.next_free

    def remove(self, block: Block) -> None:
        """Cut a page out of the middle (a cache hit on a free page)."""
        if block.prev_free is None or block.next_free is None:
            raise RuntimeError(f"{block} is not in the free queue")
        self._unlink(block)

    def append_n(self, blocks: Iterable[Block]) -> None:
        """Put pages back at the tail, in the given order."""
        for block in blocks:
            last = self._tail.prev_free
            last.next_free = block
            block.prev_free = last
            block.next_free = self._tail
            self._tail.prev_free = block
            self.num_free_blocks += 1

    def prepend_n(self, blocks: Iterable[Block]) -> None:
        """Put pages at the head, in the given order: the first goes next (0.23.0 on)."""
        first = self._head
        for block in blocks:
            after = first.next_free
            first.next_free = block
            block.prev_free = first
            block.next_free = after
            after.prev_free = block
            first = block
            self.num_free_blocks += 1

    def _unlink(self, block: Block) -> None:
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def block_ids(self) -> list[int]:
        """Head to tail; O(free pages), for tests and reports only."""
        ids, block = [], self._head.next_free
        while block is not self._tail:
            ids.append(block.block_id)
            block = block.next_free
        return ids


class BlockPool:
    """All pages, the free queue, and the map from block hash to cached pages."""

    def __init__(self, num_blocks: int, enable_caching: bool, emit: events.Listener = events.ignore,
                 enable_kv_cache_events: bool = False):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.emit = emit
        self.kv_events = KVEventQueue(enable_kv_cache_events)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        # (hash, group) -> {block_id: page}, in insertion order.  The same content
        # can be cached in several pages: pages are never merged, so that a
        # request's block table only ever grows.
        self.cached: dict[CacheKey, dict[int, Block]] = {}
        self.null_block = self.free_queue.popleft_n(1)[0]
        self.null_block.is_null = True

    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def get_cached_block(self, block_hash: BlockHash, group_ids: list[int]) -> list[Block] | None:
        """The first page cached under this hash in each of the groups; None if a group has none."""
        found = []
        for group_id in group_ids:
            pages = self.cached.get((block_hash, group_id))
            if not pages:
                return None
            found.append(next(iter(pages.values())))
        return found

    def get_new_blocks(self, n: int) -> list[Block]:
        """Hand out ``n`` pages from the head of the free queue, dropping stale hashes."""
        taken = self.free_queue.popleft_n(n)
        for block in taken:
            if self.enable_caching:
                self._evict_if_cached(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
        return taken

    def _evict_if_cached(self, block: Block) -> None:
        """A cached page that is handed out again stops being a cache entry."""
        if block.block_hash is None:
            return
        pages = self.cached[block.block_hash]
        del pages[block.block_id]
        if not pages:
            del self.cached[block.block_hash]
        self.kv_events.put(BlockRemoved((block.block_hash[0],)))
        block.block_hash = None
        self.emit(events.CachedBlockEvicted(block.block_id))

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on prefix-hit pages; a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[Block], uncached_first: bool = False) -> None:
        """Drop one reference on each page; those now unused join the tail in order.

        With ``uncached_first`` (a sliding-window, chunked-local or Mamba group from
        0.23.0, every caller from 0.24.0: every_uncached_page_reused_first) those holding
        no cached prefix go to the head instead, in order: they are reused first.
        """
        ordered = list(ordered)
        for block in ordered:
            block.ref_cnt -= 1
        freed = [b for b in ordered if b.ref_cnt == 0 and not b.is_null]
        if self.reuses_uncached_first(uncached_first):
            self.free_queue.prepend_n(b for b in freed if b.block_hash is None)
            freed = [b for b in freed if b.block_hash is not None]
        self.free_queue.append_n(freed)

    def reuses_uncached_first(self, uncached_first: bool) -> bool:
        """Whether freed pages holding no cached prefix go to the head of the free queue.
        In 0.27.x (no_caching_frees_to_the_tail) not without prefix caching: every page
        freed then joins the tail, in order; 0.28.0 sends them to the head again."""
        return True

    def can_reset_prefix_cache(self) -> bool:
        """Only when no request holds a page: the null page is the only one not free."""
        return self.num_blocks - self.num_free_blocks() == 1

    def cache_full_blocks(self, block_hashes: list[BlockHash], blocks: list[Block],
                          num_cached: int, num_full: int, group_id: int = 0,
                          request: Request | None = None, block_size: int = 0,
                          indexed: range | set[int] | None = None) -> None:
        """Index the pages ``blocks[num_cached:num_full]`` of one group under their hashes.

        Up to 0.13.0 whatever stands there is indexed, the null page too
        (quirks.NULL_PAGE_CACHED): a null page already indexed fails the check.  From
        0.14.0 (null_pages_never_cached) null pages are passed over.  With KV cache events
        on, the call is announced (``request`` and ``block_size`` say whose tokens the
        pages hold).  ``indexed``: the page indexes to index, when not all of them; the others
        are passed over like null pages (0.23.0, a group whose pages can never serve a hit;
        0.29.0, sliding-window pages no hit can start from), and the call is still announced.
        """
        if num_cached == num_full:
            return
        assert len(block_hashes) >= num_full
        skips_null = True
        stored = []
        for i, (block, block_hash) in enumerate(
                zip(blocks[num_cached:num_full], block_hashes[num_cached:]), num_cached):
            if skips_null and block.is_null or indexed is not None and i not in indexed:
                continue
            assert block.block_hash is None, f"{block} is already cached"
            key = (block_hash, group_id)
            block.block_hash = key
            self.cached.setdefault(key, {})[block.block_id] = block
            stored.append(block_hash)
        if self.kv_events.enabled:
            parent = (block_hashes[num_cached - 1] if num_cached else None) if skips_null \
                else parent_hash(blocks, num_cached)
            self.kv_events.put(BlockStored(
                block_hashes=tuple(stored), parent_block_hash=parent,
                token_ids=tuple(request.all_token_ids[num_cached * block_size:
                                                      num_full * block_size]),
                block_size=block_size, lora_id=self.announced_adapter(request)))

    def announced_adapter(self, request: Request) -> int | None:
        """The LoRA adapter a BlockStored names: its integer id.  0.11.0 asks the adapter
        for an id it does not have, and the engine raises (quirks.KV_EVENTS_FAIL_WITH_LORA;
        fixed in 0.11.1, kv_events_name_the_adapter)."""
        return request.lora_id

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any page is in use."""
        if not self.can_reset_prefix_cache():
            return False
        self.cached = {}
        for block in self.blocks:
            block.block_hash = None
        self.kv_events.put(AllBlocksCleared())
        return True


def parent_hash(blocks: list[Block], num_cached: int) -> BlockHash | None:
    """The hash of the page before the newly indexed ones, as that page is indexed now (up
    to 0.13.0; later releases take the request's own hash of that page).

    That page must be indexed: a null page that took its place and was never
    indexed fails the check (sliding windows, quirks.NULL_PAGE_CACHED).
    """
    if num_cached == 0:
        return None
    parent = blocks[num_cached - 1]
    assert parent.block_hash is not None, f"parent {parent} is not cached"
    return parent.block_hash[0]
