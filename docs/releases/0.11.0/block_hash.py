"""Prefix-cache keys: one chained hash per full block of a request's tokens.

Mirrors: vllm/v1/core/kv_cache_utils.py (hash_block_tokens,
get_request_block_hasher, generate_block_hash_extra_keys).

Block ``i`` is keyed by the key of block ``i - 1``, the block's tokens and its
extra keys, so two requests share a key only if they share the whole prefix.
The extra keys say what else the block's KV depends on: the LoRA adapter (on
every block), the content hashes of the multimodal items whose placeholders
the block touches, then the cache salt (on the first block only).  The root of
the chain is random per process in vLLM; keys are therefore never compared
across engines.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

BlockHash = bytes

_ROOT = b"reference-root"


@dataclass(frozen=True)
class HashInputs:
    """What a request's block keys depend on besides its tokens."""

    lora_id: int | None = None
    cache_salt: str | None = None
    # Multimodal items in prompt order: objects with offset, length and mm_hash.
    encoder_inputs: tuple = ()
    # 0.19.0 and later (mm_hash_keys_carry_the_offset): an item's key is its content hash
    # and its offset from the block's start, and an item ending at the block's start is past.
    mm_keys_with_offset: bool = False
    # 0.31.0 and later (later_hashing_sees_every_item): a later hashing looks from the first
    # item that has not ended before the block, not from the last item.
    later_hashing_sees_every_item: bool = False
    # 0.33.0 and later with an eagle drafter (eagle_hashes_cover_the_next_token): a block's
    # key also covers this many tokens after it, and the items touching them.
    lookahead_tokens: int = 0


def hash_block(parent: BlockHash | None, tokens: Sequence[int], extra: tuple | None) -> BlockHash:
    """The key of one full block, chained to its parent's key."""
    material = repr((parent or _ROOT, tuple(tokens), extra)).encode()
    return hashlib.sha256(material).digest()


def extra_keys(inputs: HashInputs, block_start: int, mm: tuple = ()) -> tuple | None:
    """The adapter's keys, the multimodal ones, then the salt's; None when there are none."""
    keys = lora_keys(inputs.lora_id) + mm + salt_keys(inputs.cache_salt, block_start)
    return keys or None


def mm_keys(items: tuple, start: int, end: int, item: int,
            with_offset: bool = False) -> tuple[tuple, int]:
    """The keys of the items the block ``[start, end)`` touches, looking from item number
    ``item`` on; also the item the next block starts looking from.

    An item that ended before the block is passed over; an item the block leaves
    unfinished stops the look (the next block starts from it).  Up to 0.18.1 an item
    ending exactly where the block starts still counts as touching it, and its key is
    its content hash; from 0.19.0 (``with_offset``) it does not, and the key also holds
    where the item starts relative to the block.
    """
    if not items or ended_before(items[-1], start, with_offset):
        return (), item  # every item lies before the block
    keys = []
    while item < len(items):
        it = items[item]
        if end <= it.offset:
            break
        if ended_before(it, start, with_offset):
            item += 1
            continue
        keys.append((it.mm_hash, it.offset - start) if with_offset else it.mm_hash)
        if end < it.offset + it.length:
            break
        item += 1
    return tuple(keys), item


def ended_before(item, start: int, with_offset: bool = False) -> bool:
    """The item ended before the block.  Up to 0.18.1 one ending exactly at ``start`` has
    not (quirks.MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING); from 0.19.0 it has."""
    end = item.offset + item.length
    return start >= end if with_offset else start > end


def first_item_to_look_at(items: tuple, start: int, every_item: bool = False,
                          with_offset: bool = False) -> int:
    """A request's first hashing looks from its first item; a later one (a block filled
    with outputs) only at its last item (quirks.MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING) --
    from 0.31.0 (``every_item``) from the first item not ended before the block."""
    if start == 0:
        return 0
    if every_item:
        return next((i for i, it in enumerate(items) if not ended_before(it, start, with_offset)),
                    len(items))
    return max(len(items) - 1, 0)


def lora_keys(lora_id: int | None) -> tuple:
    """An adapter changes every layer's KV, so its integer id enters every block's key."""
    return () if lora_id is None else (lora_id,)


def salt_keys(cache_salt: str | None, block_start: int) -> tuple:
    """The salt separates tenants; it enters the chain once, on the first block."""
    return (cache_salt,) if block_start == 0 and cache_salt else ()


def extend_block_hashes(hashes: list[BlockHash], tokens: Sequence[int], block_size: int,
                        inputs: HashInputs) -> None:
    """Append the keys of the blocks that have become full since the last call."""
    start = len(hashes) * block_size
    item = first_item_to_look_at(inputs.encoder_inputs, start,
                                 inputs.later_hashing_sees_every_item, inputs.mm_keys_with_offset)
    ahead = inputs.lookahead_tokens
    while start + block_size + ahead <= len(tokens):
        parent = hashes[-1] if hashes else None
        end = start + block_size
        mm, item = mm_keys(inputs.encoder_inputs, start, end + ahead, item,
                           inputs.mm_keys_with_offset)
        extra = extra_keys(inputs, start, mm)
        if ahead:
            extra = (extra, tuple(tokens[end:end + ahead]))
            item = back_to_items_past(inputs.encoder_inputs, item, end)
        hashes.append(hash_block(parent, tokens[start:end], extra))
        start = end


def back_to_items_past(items: tuple, item: int, end: int) -> int:
    """A block hashed with tokens after it may have looked past items the next block
    touches too: the next block looks again from the first of them."""
    while item > 0 and items[item - 1].offset + items[item - 1].length > end:
        item -= 1
    return item
