"""Pages per request: prefix lookup, allocation, caching of full pages, freeing.

Mirrors: vllm/v1/core/kv_cache_manager.py (KVCacheManager), the one-group
case of vllm/v1/core/kv_cache_coordinator.py (UnitaryKVCacheCoordinator,
KVCacheCoordinatorNoPrefixCache) and vllm/v1/core/single_type_kv_cache_manager.py
(SingleTypeKVCacheManager, FullAttentionManager).

A request's pages form its block table: page ``i`` holds tokens
``i * block_size .. (i + 1) * block_size - 1``.  Tables only grow while the
request runs; they are dropped whole when it finishes or is preempted.
"""

from __future__ import annotations

from reference import events
from reference.arith import cdiv
from reference.block_pool import Block, BlockPool
from reference.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool, use_eagle: bool, emit: events.Listener = events.ignore):
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.emit = emit
        self.pool = BlockPool(num_blocks, enable_caching, emit)
        self.req_to_blocks: dict[str, list[Block]] = {}
        # Full pages of each running request already indexed in the cache.
        self.num_cached_block: dict[str, int] = {}

    # -- prefix lookup -----------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[Block], int]:
        """Cached pages holding a prefix of the request, and how many tokens they cover."""
        if self.skips_prefix_cache(request):
            hit: list[Block] = []
        else:
            hit = self.longest_cache_hit(request.block_hashes, self.max_hit_tokens(request))
        self.emit(events.PrefixLookup(request.request_id, len(hit) * self.block_size))
        return hit, len(hit) * self.block_size

    def skips_prefix_cache(self, request: Request) -> bool:
        """No lookup without caching, nor for prompt logprobs (every prompt token is computed)."""
        return not self.enable_caching or request.wants_prompt_logprobs

    def max_hit_tokens(self, request: Request) -> int:
        """At least the last token is recomputed, to get logits from it."""
        return request.num_tokens - 1

    def longest_cache_hit(self, block_hashes: list[bytes], max_length: int) -> list[Block]:
        """Leading cached pages, whole pages only, covering at most ``max_length`` tokens."""
        hit = []
        for block_hash in block_hashes[:max_length // self.block_size]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break  # the hashes are chained: nothing after a miss can hit
            hit.append(block)
        self.trim_hit_for_eagle(hit)
        return hit

    def trim_hit_for_eagle(self, hit: list[Block]) -> None:
        """Eagle needs the hidden states of the last hit page: it is recomputed."""
        if self.use_eagle and hit:
            hit.pop()

    # -- allocation ----------------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[Block] | None = None,
                       num_lookahead_tokens: int = 0) -> list[Block] | None:
        """Give the request pages for its new tokens; None when the pool is short.

        Slots are needed for the computed tokens, the prefix hit, the new tokens
        and the lookahead, capped at ``max_model_len``.  Prefix-hit pages that sit
        in the free queue count as pages to allocate, since taking them shrinks
        the free queue too.  On success, pages that became full are cached, up to
        the request's real tokens (never its drafts).
        """
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        hit = new_computed_blocks or []
        table = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_slots = min(num_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if not hit and len(table) * self.block_size >= num_slots and table:
            new_blocks: list[Block] = []  # the common decode step: its pages suffice
        else:
            if self.pages_to_allocate(table, num_slots, hit) > self.pool.num_free_blocks():
                return None
            if hit or request.request_id not in self.num_cached_block:
                self._save_hit(request.request_id, table, hit)
            new_blocks = self._grow_table(table, num_slots)
        if self.enable_caching:
            self.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def pages_to_allocate(self, table: list[Block], num_slots: int, hit: list[Block]) -> int:
        missing = cdiv(num_slots, self.block_size) - len(hit) - len(table)
        return missing + self.free_hit_pages(hit) if hit else missing

    def free_hit_pages(self, hit: list[Block]) -> int:
        """Hit pages sitting in the free queue: taking them shrinks it like new pages do."""
        return sum(1 for b in hit if b.ref_cnt == 0 and not b.is_null)

    def _save_hit(self, request_id: str, table: list[Block], hit: list[Block]) -> None:
        """A newly admitted request starts its table with its prefix-hit pages."""
        assert request_id not in self.num_cached_block, "a running request cannot gain prefix hits"
        assert not table
        if self.enable_caching:
            self.pool.touch(hit)
        table.extend(hit)
        self.num_cached_block[request_id] = len(hit)

    def _grow_table(self, table: list[Block], num_slots: int) -> list[Block]:
        missing = cdiv(num_slots, self.block_size) - len(table)
        if missing <= 0:
            return []
        new_blocks = self.pool.get_new_blocks(missing)
        table.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Index the request's pages that ``num_tokens`` fill completely."""
        num_full = num_tokens // self.block_size
        num_cached = self.num_cached_block[request.request_id]
        if num_full != num_cached:
            self.pool.cache_full_blocks(request.block_hashes, self.req_to_blocks[request.request_id],
                                        num_cached, num_full)
        self.num_cached_block[request.request_id] = num_full

    # -- release -------------------------------------------------------------------

    def free(self, request: Request) -> None:
        """Return the request's pages to the pool."""
        table = self.req_to_blocks.pop(request.request_id, [])
        self.pool.free_blocks(self.free_order(table))
        self.num_cached_block.pop(request.request_id, None)

    def free_order(self, table: list[Block]):
        """Tail first, so that a request's tail is evicted before its shared prefix."""
        return reversed(table)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id) or []]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
