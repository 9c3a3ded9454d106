"""vLLM mutants: patches of the real vLLM that stand in for an upgrade that changed one rule.

The conformance suite must notice each of them as it would notice a real
behaviour change in a new vLLM release.
"""

from __future__ import annotations

import contextlib

from harness.engines import vllm_env  # noqa: F401  (before vLLM is imported)
from harness.formats.mutant import (BLOCK_POOL, SCHED_UTILS, SINGLE_TYPE, Mutant,
                             replace)
from vllm.v1.core import kv_cache_utils
from vllm.v1.core import single_type_kv_cache_manager as stm
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.sched import scheduler as vsched
from vllm.v1.engine.core import EngineCore

_check_stop = vsched.check_stop
_get_new_blocks = BlockPool.get_new_blocks


def _free_forward(self, request_id):
    blocks = self.req_to_blocks.pop(request_id, [])
    self.block_pool.free_blocks(blocks)
    self.num_cached_block.pop(request_id, None)


def _stop_tokens_ignored(request, max_model_len, pooler_output=None):
    saved = request.sampling_params.stop_token_ids
    request.sampling_params.stop_token_ids = []
    try:
        return _check_stop(request, max_model_len, pooler_output)
    finally:
        request.sampling_params.stop_token_ids = saved


def _new_blocks_reversed(self, num_blocks):
    return list(reversed(_get_new_blocks(self, num_blocks)))


MUTANTS = [
    Mutant("vllm_free_forward_order", "upgrade frees pages head first", SINGLE_TYPE,
           replace(stm.SingleTypeKVCacheManager, "free", _free_forward), side="vllm"),
    Mutant("vllm_stop_tokens_ignored", "upgrade stops honouring stop_token_ids", SCHED_UTILS,
           replace(vsched, "check_stop", _stop_tokens_ignored), side="vllm"),
    Mutant("vllm_new_blocks_reversed", "upgrade hands out new pages in reverse order", BLOCK_POOL,
           replace(BlockPool, "get_new_blocks", _new_blocks_reversed), side="vllm"),
]


# -- later releases' start-up, on vLLM 0.11.0 ---------------------------------------------
# Patches of 0.11.0's start-up that stand in for later ones, to show the vllm-core engine's
# refusals (tests/test_vllm_core.py); written on 0.11.0's internals, used only there.

def start_up_holds_back_a_page() -> contextlib.AbstractContextManager:
    """0.29.0's start-up check: one max_model_len request must fit in the pool less the
    null page (0.11.0's check, shown one page less in every layer)."""
    real = kv_cache_utils.check_enough_kv_cache_memory

    def check(vllm_config, spec, available):
        page = next(iter(spec.values())).page_size_bytes
        return real(vllm_config, spec, available - page * len(spec))
    return replace(kv_cache_utils, "check_enough_kv_cache_memory", check)()


def start_up_check_fails(message: str) -> contextlib.AbstractContextManager:
    """A ValueError raised during start-up, not by vLLM's sizing code (from here)."""
    def check(vllm_config, spec, available):
        raise ValueError(message)
    return replace(kv_cache_utils, "check_enough_kv_cache_memory", check)()


def start_up_sets_block_size(block_size: int) -> contextlib.AbstractContextManager:
    """0.34.0's start-up: once the pool is sized, the block size becomes the KV cache
    groups' smallest page."""
    real = EngineCore._initialize_kv_caches

    def initialize(self, vllm_config):
        sized = real(self, vllm_config)
        vllm_config.cache_config.block_size = block_size
        return sized
    return replace(EngineCore, "_initialize_kv_caches", initialize)()
