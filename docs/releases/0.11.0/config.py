"""The knobs the scheduler and the KV cache manager read.

Mirrors: vllm/config/scheduler.py (SchedulerConfig), vllm/config/cache.py
(CacheConfig), LoRAConfig's ``max_loras`` and the two members of
SpeculativeConfig the scheduler uses;
``rules`` names the rule changes of the release described (reference.releases).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from reference.kv_cache_spec import KVCacheSpec, full


@dataclass(frozen=True)
class Config:
    block_size: int
    num_blocks: int  # the whole pool, null block included
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"  # or "priority"
    num_speculative_tokens: int = 0
    use_eagle: bool = False
    # The KV cache groups, in order; none: one full-attention group of block_size.
    kv_cache_groups: tuple[KVCacheSpec, ...] = ()
    # LoRA: the most distinct adapters in one step; None: LoRA off.
    max_loras: int | None = None
    # Multimodal: encoder tokens per step and the encoder cache's room as configured
    # (None: max_num_batched_tokens, SchedulerConfig's own choice), the largest item of
    # each modality the model takes (none: a text-only model, no encoder), and whether a
    # placeholder must be computed in one step.
    encoder_compute_budget: int | None = None
    encoder_cache_size: int | None = None
    max_tokens_by_modality: tuple[tuple[str, int], ...] = ()
    disable_chunked_mm_input: bool = False
    # KV cache events (vLLM's KVEventsConfig.enable_kv_cache_events): the block pool
    # announces what enters and leaves the prefix-cache index.
    enable_kv_cache_events: bool = False
    # vLLM's --async-scheduling: the engine runs the AsyncScheduler (one batch ahead).
    async_scheduling: bool = False
    # vLLM's --pipeline-parallel-size: batches the executor takes at once.
    pipeline_parallel_size: int = 1
    # Whether every update ends with a stats report (vLLM's log_stats).
    log_stats: bool = True
    # Rule changes of a later release in effect (reference.releases); none: 0.11.0.
    # (Any set: the upgrade check passes one that notes each rule asked about, which a
    # test of membership in a frozenset, compiled, would pass by.)
    rules: Set[str] = frozenset()

    def start_up_refusal(self) -> str | None:
        """Why vLLM's config validation refuses this config at start-up, or None.  From
        0.27.0 (threshold_above_max_model_len_refused) a long-prefill threshold above
        max_model_len; before, only with several partial prefills, which vLLM 0.11.0's
        default of one never is."""
        return None

    # -- rules of the engine around the scheduler ------------------------------------------
    # Start-up, the worker, the metrics and the engine loop: the harness's reference
    # engine asks these, so that every rule ask lives in the reference.

    def start_up_holds_back_null_page(self) -> bool:
        """From 0.29.0 (startup_check_holds_back_null_page) the start-up check plans
        without the page of every layer the block pool keeps back as the null page
        (vllm/v1/core/kv_cache_utils.py)."""
        return False

    def mm_keys_carry_the_offset(self) -> bool:
        """From 0.19.0 (mm_hash_keys_carry_the_offset) a block's multimodal key names each
        item with its offset (vllm/v1/core/kv_cache_utils.py)."""
        return False

    def prefix_stats_split_preempted(self) -> bool:
        """From 0.14.0 (prefix_stats_split_preempted) the prefix-cache stats count the
        lookups of preempted requests apart (vllm/v1/metrics/stats.py)."""
        return False

    def kv_tensor_layout(self) -> tuple[bool, bool]:
        """The worker's KV tensor: whether pages come first (kv_pages_first_in_tensor) and
        whether K and V are packed in the last dimension (kv_packed_in_last_dim)
        (vllm/v1/attention/backends/flash_attn.py)."""
        return False, False

    def batch_queue_fills_before_applying(self) -> bool:
        """From 0.23.0 (batch_queue_fills_before_applying) EngineCore applies the oldest
        batch only once its queue is full or nothing is left (vllm/v1/engine/core.py)."""
        return False

    @property
    def groups(self) -> tuple[KVCacheSpec, ...]:
        return self.kv_cache_groups or (full(self.block_size),)

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots reserved beyond the scheduled tokens: eagle drafts in the KV cache."""
        return self.num_speculative_tokens if self.use_eagle else 0
