"""What one KV cache group keeps per request: its attention type and page size.

Mirrors: vllm/v1/kv_cache_interface.py (FullAttentionSpec, SlidingWindowSpec,
ChunkedLocalAttentionSpec, MambaSpec, KVCacheGroupSpec), reduced to what the
KV cache manager reads.  Byte sizes live in ``reference.kv_sizing``.

A model whose layers all use full attention has one group.  A hybrid model
has one group per kind of layer it mixes (Gemma 3: full and sliding window;
Llama 4: full and chunked local; Granite 4.0-H: full and Mamba), and every
group draws its pages from the one shared pool.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL = "full"
SLIDING_WINDOW = "sliding_window"
CHUNKED_LOCAL = "chunked_local"
MAMBA = "mamba"

KINDS = (FULL, SLIDING_WINDOW, CHUNKED_LOCAL, MAMBA)


@dataclass(frozen=True)
class KVCacheSpec:
    """One group's attention type, with the parameter that type reads.

    ``sliding_window``: tokens a sliding-window layer attends to, the current
    one included.  ``attention_chunk_size``: a chunked-local layer attends
    only inside its chunk of this many tokens.  ``num_speculative_blocks``: a
    Mamba layer keeps one state page per request plus this many for the
    drafts (vLLM sets it to ``num_speculative_tokens``).  A Mamba group's
    ``block_size`` is ``max_model_len``: one page holds a whole request.
    """

    kind: str
    block_size: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    num_speculative_blocks: int = 0

    @property
    def is_full(self) -> bool:
        return self.kind == FULL


def full(block_size: int) -> KVCacheSpec:
    return KVCacheSpec(FULL, block_size)
