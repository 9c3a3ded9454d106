"""vLLM mutants: patches of the real vLLM that stand in for an upgrade that changed one rule.

The conformance suite must notice each of them as it would notice a real
behaviour change in a new vLLM release.
"""

from __future__ import annotations

from harness.engines import vllm_env  # noqa: F401  (before vLLM is imported)
from harness.patches import (BLOCK_POOL, SCHED_UTILS, SINGLE_TYPE, Mutant,
                             replace)
from vllm.v1.core import single_type_kv_cache_manager as stm
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.sched import scheduler as vsched

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
