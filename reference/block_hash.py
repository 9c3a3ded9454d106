"""Prefix-cache keys: one chained hash per full block of a request's tokens.

Mirrors: vllm/v1/core/kv_cache_utils.py (hash_block_tokens,
get_request_block_hasher, generate_block_hash_extra_keys).

Block ``i`` is keyed by the key of block ``i - 1``, the block's tokens and its
extra keys, so two requests share a key only if they share the whole prefix.
The extra keys say what else the block's KV depends on: the LoRA adapter (on
every block), then the cache salt (on the first block only).  The root of
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


def hash_block(parent: BlockHash | None, tokens: Sequence[int], extra: tuple | None) -> BlockHash:
    """The key of one full block, chained to its parent's key."""
    material = repr((parent or _ROOT, tuple(tokens), extra)).encode()
    return hashlib.sha256(material).digest()


def extra_keys(inputs: HashInputs, block_start: int) -> tuple | None:
    """The adapter's keys, then the salt's; None when there are none."""
    keys = lora_keys(inputs.lora_id) + salt_keys(inputs.cache_salt, block_start)
    return keys or None


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
    while start + block_size <= len(tokens):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block(parent, tokens[start:start + block_size],
                                 extra_keys(inputs, start)))
        start += block_size
