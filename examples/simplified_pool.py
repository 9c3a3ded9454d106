"""A deliberately simplified engine: vLLM 0.11.0's rules, with the page pool done the way
some simulators do it.

    python -m harness replay --engine examples.simplified_pool:SimplifiedPoolEngine
    python -m harness check  --engines examples.simplified_pool:SimplifiedPoolEngine fixtures/streams/*.json

Two simplifications, both common in simulators' own block managers:

* **No null page.**  Every page id ``0 .. num_blocks - 1`` is free at start and handed
  out from 0.  vLLM keeps page 0 back as the null page (sliding windows put it in place
  of pages they gave back), so its first request gets page 1 and its pool has one page
  fewer to offer; every block id, every free-page count and the point at which a
  request is preempted follow from that.
* **Pages freed first to last.**  vLLM frees a finished or preempted request's pages
  last page first, so that the tail of a prompt, the part least likely to be shared,
  is the first to be reused; freed first page first, a shared prefix is evicted
  before the tail and later prefix hits are lost.

An engine of your own implements the methods of docs/engine-interface.md from
scratch.  This one starts from the reference and changes only the pool, so the
report shows what these two choices cost and nothing else.  It takes streams with
one full-attention KV cache group (the default); ``refuses`` says so for the others.
"""

from __future__ import annotations

from harness.engines.reference_engine import ReferenceEngine
from reference.block_pool import FreeBlockQueue


class SimplifiedPoolEngine(ReferenceEngine):
    name = "simplified-pool"

    def refuses(self, stream) -> str | None:
        groups = stream.config.kv_cache_groups
        if groups is not None and [g.type for g in groups] != ["full"]:
            return "simplified-pool models one full-attention KV cache group only"
        return None

    def start(self, stream) -> None:
        super().start(stream)
        kv = self.sched.kv
        pool = kv.pool
        # No null page: page 0 is an ordinary page, first in the free queue.
        pool.null_block.is_null = False
        pool.free_queue = FreeBlockQueue(pool.blocks)
        # Pages freed in table order, first page first.
        for manager in kv.coordinator.managers:
            manager.free_order = lambda table: table
