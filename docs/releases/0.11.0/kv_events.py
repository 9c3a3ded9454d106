"""KV cache events: what a KV-aware router is told about the prefix cache.

Mirrors: vllm/distributed/kv_events.py (BlockStored, BlockRemoved,
AllBlocksCleared) and where vllm/v1/core/block_pool.py queues them.

With KV cache events on, the block pool queues an event whenever its
prefix-cache index changes:

* pages indexed under their hashes: one ``BlockStored`` per indexing call,
  listing the new pages' hashes in table order, the hash of the page before
  them in the request's table (the chain's parent; none for the first page),
  the tokens they hold, the page size and the request's LoRA adapter;
* a cached page handed out again (its hash dropped): one ``BlockRemoved``
  for that page;
* the whole index forgotten by a prefix-cache reset: ``AllBlocksCleared``.

Freeing a page changes nothing in the index, so it sends nothing: a router
keeps counting a freed page as a hit until the page is reused.  The
scheduler takes the queue once per step and publishes it as one batch,
unless it is empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from reference.block_hash import BlockHash

#: Where the pages live: always the accelerator's memory for the scheduler's pool.
GPU = "GPU"


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str = GPU


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str = GPU


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventQueue:
    """The events queued since the scheduler last took them; nothing is kept when off."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.pending: list[KVEvent] = []

    def put(self, event: KVEvent) -> None:
        if self.enabled:
            self.pending.append(event)

    def take(self) -> list[KVEvent]:
        taken, self.pending = self.pending, []
        return taken
