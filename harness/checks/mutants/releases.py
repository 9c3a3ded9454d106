"""Mutants of the releases: each takes one rule change out of the release that brought it
(``<change>_dropped``), or keeps it past the release that undid it (``<change>_kept``)."""

from __future__ import annotations

from harness.checks.mutants.applies import (
    async_scheduling,
    batch_queue,
    caching,
    chunked_local,
    chunked_local_caching,
    chunked_mm_off,
    chunked_off,
    chunked_off_threshold,
    connector,
    connector_async,
    connector_loads,
    connector_sends,
    drafts,
    eagle,
    eagle_and_caching,
    encoder,
    encoder_and_caching,
    encoder_eagle,
    grammar,
    grammar_drafts,
    hybrid_caching,
    kv_events_lora,
    lora,
    priority,
    sliding,
    sliding_caching,
    stats,
    stats_caching,
    threshold,
)
from harness.checks.mutants.registry import MUTANTS
from harness.formats.mutant import (
    BLOCK_POOL,
    ENGINE_CORE,
    KV_CACHE_COORDINATOR,
    KV_CACHE_MANAGER,
    KV_CACHE_UTILS,
    SCHED_UTILS,
    SCHEDULER,
    SINGLE_TYPE,
    Mutant,
    replace,
)
from reference import config as rconfig
from reference import releases

_has = rconfig.Config.has


_CHANGE_MODULES = {
    "priority_victim_loses_its_grant": SCHEDULER,
    "stop_tokens_before_length": SCHED_UTILS,
    "running_tokens_capped_by_max_tokens": SCHEDULER,
    "threshold_dropped_when_nothing_chunks": "vllm/config/vllm.py",
    "chunked_off_stops_at_first_misfit": SCHEDULER,
    "chunked_local_frees_last_cached_page": SINGLE_TYPE,
    "grammar_rows_in_grant_order": SCHEDULER,
    "prefix_stats_split_preempted": KV_CACHE_MANAGER,
    "kv_events_name_the_adapter": BLOCK_POOL,
    "eagle_encoder_one_token_ahead": SCHEDULER,
    "eagle_lookahead_item_waits": SCHEDULER,
    "abort_skips_finished_requests": SCHEDULER,
    "kv_events_published_after_update": SCHEDULER,
    "async_skips_requests_at_max_tokens": SCHEDULER,
    "admission_reserves_whole_sequence": SCHEDULER,
    "set_aside_requests_wait_apart": SCHEDULER,
    "connector_told_whole_table": SCHEDULER,
    "null_pages_never_cached": BLOCK_POOL,
    "window_hits_skipped_at_admission": SINGLE_TYPE,
    "window_pages_freed_before_connector_finish": SCHEDULER,
    "waiting_stats_count_set_aside_apart": SCHEDULER,
    "connector_finish_window_of_computed_tokens": SCHEDULER,
    "admission_reserves_lookahead": SCHEDULER,
    "uncached_pages_reused_first": SINGLE_TYPE,
    "window_of_one_indexes_nothing": SINGLE_TYPE,
    "kv_pages_first_in_tensor": "vllm/v1/attention/backends/flash_attn.py",
    "every_uncached_page_reused_first": BLOCK_POOL,
    "set_aside_order_kept": "vllm/v1/core/sched/request_queue.py",
    "grammar_rows_skip_prefill_chunks": SCHEDULER,
    "async_load_counts_tokens_at_once": SCHEDULER,
    "mm_hash_keys_carry_the_offset": KV_CACHE_UTILS,
    "loaded_preempted_request_resumes": SCHEDULER,
    "failed_admission_lets_go_of_encoder_inputs": SCHEDULER,
    "hybrid_hit_searched_until_groups_agree": KV_CACHE_COORDINATOR,
    "hybrid_eagle_drop_once_per_group": KV_CACHE_COORDINATOR,
    "aborted_load_keeps_pages_until_done": SCHEDULER,
    "eagle_whole_item_cut_one_token_earlier": SCHEDULER,
    "kv_packed_in_last_dim": "vllm/v1/attention/backends/flash_attn.py",
    "prefix_stats_counted_at_admission": SCHEDULER,
    "no_caching_frees_to_the_tail": BLOCK_POOL,
    "async_load_leaves_room_for_prefills": SCHEDULER,
    "connector_finish_sees_computed_pages": SCHEDULER,
    "window_admission_capped": SINGLE_TYPE,
    "window_cap_on_every_allocation": SINGLE_TYPE,
    "passed_over_victim_keeps_the_pass": SCHEDULER,
    "lone_group_must_divide_block_size": KV_CACHE_COORDINATOR,
    "recached_outputs_not_freed": "vllm/v1/core/encoder_cache_manager.py",
    "items_taken_per_request": "vllm/v1/core/encoder_cache_manager.py",
    "encoder_frees_wait_for_outputs": SCHEDULER,
    "placeholder_tokens_hold_encoder_outputs": SCHEDULER,
    "batch_queue_fills_before_applying": ENGINE_CORE,
    "held_to_last_occurrence": "vllm/v1/core/encoder_cache_manager.py",
    "window_frees_wait_for_outputs": KV_CACHE_MANAGER,
    "window_cap_counts_batches_in_flight": "vllm/config/vllm.py",
    "new_decode_padded_with_drafts": SCHEDULER,
    "decode_padding_leaves_room_to_sample": SCHEDULER,
    "padding_without_running_requests": SCHEDULER,
    "threshold_lifted_for_a_lone_request": SCHEDULER,
    "external_hit_ignored_without_prefix_reads": SCHEDULER,
    "later_hashing_sees_every_item": KV_CACHE_UTILS,
    "page_holders_wait_first": SCHEDULER,
    "lora_slots_held_by_every_running_request": SCHEDULER,
    "priority_self_preemption_goes_on": SCHEDULER,
    "encoder_cut_sets_aside": SCHEDULER,
    "outputs_update_the_cache_at_once": SCHEDULER,
    "eagle_hashes_cover_the_next_token": KV_CACHE_UTILS,
    "threshold_needs_chunked_prefill": SCHEDULER,
    "unchunked_mm_prompt_not_split": SCHEDULER,
    "range_inside_item_waits_for_the_rest": SCHEDULER,
    "grammar_keeps_first_invalid_draft": "vllm/v1/structured_output/__init__.py",
    "placeholder_leaves_last_row_unfilled": "vllm/v1/structured_output/__init__.py",
    "encoder_outputs_held_for_the_drafter": SCHEDULER,
    "encoder_cuts_at_the_item": SCHEDULER,
    "encoder_length_mismatch_fails_request": SCHEDULER,
    "startup_check_holds_back_null_page": KV_CACHE_UTILS,
    "window_pages_cached_sparsely": SINGLE_TYPE,
    "eagle_window_tails_at_replay_hits": SINGLE_TYPE,
    "eagle_search_reaches_the_last_key": KV_CACHE_COORDINATOR,
    "async_load_reserves_a_draft_step": SCHEDULER,
    "draft_step_counted_in_each_group": SCHEDULER,
    "whole_item_cut_before_lookups": SCHEDULER,
    "threshold_above_max_model_len_refused": "vllm/config/scheduler.py",
    "sending_requests_keep_the_engine_stepping": SCHEDULER,
}


def _without(name: str):
    def has(self, rule_change):
        return rule_change != name and _has(self, rule_change)
    return has


def _kept(name: str):
    def has(self, rule_change):
        return rule_change == name or _has(self, rule_change)
    return has


_CHANGE_APPLIES = {
    "priority_victim_loses_its_grant": priority,
    "threshold_dropped_when_nothing_chunks": lambda s: chunked_off_threshold(s) and not caching(s),
    "chunked_off_stops_at_first_misfit": chunked_off,
    "chunked_local_frees_last_cached_page": chunked_local_caching,
    "grammar_rows_in_grant_order": grammar,
    "prefix_stats_split_preempted": stats,
    "kv_events_name_the_adapter": kv_events_lora,
    "eagle_encoder_one_token_ahead": encoder_eagle,
    "eagle_lookahead_item_waits": encoder_eagle,
    "abort_skips_finished_requests": lambda s: connector_sends(s) and any(
        r.abort_step is not None for r in s.requests),
    # Any batch queue, pipeline stages too (found by test_skipped_runs_could_not_have_changed_
    # the_trace once it drew every property's streams; it said async scheduling only).
    "kv_events_published_after_update": lambda s: batch_queue(s) and s.config.kv_cache_events,
    "async_skips_requests_at_max_tokens": async_scheduling,
    "mm_hash_keys_carry_the_offset": encoder_and_caching,
    "async_load_counts_tokens_at_once": connector_async,
    "loaded_preempted_request_resumes": connector_async,
    "failed_admission_lets_go_of_encoder_inputs": encoder,
    "hybrid_hit_searched_until_groups_agree": lambda s: hybrid_caching(s) and eagle(s),
    "hybrid_eagle_drop_once_per_group": lambda s: hybrid_caching(s) and eagle(s),
    "aborted_load_keeps_pages_until_done": lambda s: connector_async(s) and any(
        r.abort_step is not None for r in s.requests),
    "eagle_whole_item_cut_one_token_earlier": lambda s: chunked_mm_off(s) and s.config.uses_eagle,
    "kv_packed_in_last_dim": lambda s: s.config.kv_cache_memory_bytes is not None,
    "prefix_stats_counted_at_admission": stats_caching,
    "no_caching_frees_to_the_tail": lambda s: not caching(s),
    "async_load_leaves_room_for_prefills": connector_async,
    "connector_finish_sees_computed_pages": connector,
    "window_admission_capped": lambda s: sliding(s) or chunked_local(s),
    "window_cap_on_every_allocation": lambda s: sliding(s) or chunked_local(s),
    "passed_over_victim_keeps_the_pass": priority,
    "lone_group_must_divide_block_size": lambda s: s.config.kv_cache_groups is not None
    and len(s.config.kv_cache_groups) == 1,
    "recached_outputs_not_freed": encoder,
    "items_taken_per_request": encoder,
    "encoder_frees_wait_for_outputs": encoder,
    "placeholder_tokens_hold_encoder_outputs": lambda s: encoder(s) and batch_queue(s),
    "batch_queue_fills_before_applying": batch_queue,
    "held_to_last_occurrence": encoder,
    "window_frees_wait_for_outputs": lambda s: (sliding(s) or chunked_local(s))
    and batch_queue(s),
    "window_cap_counts_batches_in_flight": lambda s: (sliding(s) or chunked_local(s))
    and batch_queue(s),
    "new_decode_padded_with_drafts": drafts,
    "decode_padding_leaves_room_to_sample": drafts,
    "connector_told_whole_table": connector,
    "null_pages_never_cached": lambda s: sliding_caching(s) or chunked_local_caching(s),
    "window_pages_cached_sparsely": sliding_caching,
    "eagle_window_tails_at_replay_hits": lambda s: sliding_caching(s) and eagle(s),
    "eagle_search_reaches_the_last_key": lambda s: hybrid_caching(s) and eagle(s),
    "padding_without_running_requests": drafts,
    "threshold_lifted_for_a_lone_request": threshold,
    "external_hit_ignored_without_prefix_reads": lambda s: connector_loads(s) and any(
        r.prompt_logprobs is not None for r in s.requests),
    "later_hashing_sees_every_item": encoder_and_caching,
    "lora_slots_held_by_every_running_request": lora,
    "priority_self_preemption_goes_on": priority,
    "encoder_cut_sets_aside": encoder,
    "outputs_update_the_cache_at_once": lambda s: drafts(s) or batch_queue(s),
    "eagle_hashes_cover_the_next_token": eagle_and_caching,
    "threshold_needs_chunked_prefill": chunked_off_threshold,
    "unchunked_mm_prompt_not_split": lambda s: encoder(s) and chunked_off(s),
    "range_inside_item_waits_for_the_rest": lambda s: encoder(s) and s.config.disable_chunked_mm_input,
    "grammar_keeps_first_invalid_draft": grammar_drafts,
    "placeholder_leaves_last_row_unfilled": grammar_drafts,
    "encoder_outputs_held_for_the_drafter": lambda s: encoder(s) and s.config.uses_eagle,
    "encoder_cuts_at_the_item": encoder,
    "encoder_length_mismatch_fails_request": encoder,
    "startup_check_holds_back_null_page": lambda s: s.config.kv_cache_memory_bytes is not None,
    "async_load_reserves_a_draft_step": lambda s: connector_async(s) and drafts(s),
    "draft_step_counted_in_each_group": lambda s: connector_async(s) and drafts(s),
    "whole_item_cut_before_lookups": lambda s: encoder(s) and s.config.disable_chunked_mm_input,
    "threshold_above_max_model_len_refused": lambda s:
        s.config.long_prefill_token_threshold > s.config.max_model_len,
    "sending_requests_keep_the_engine_stepping": connector_sends,
}


#: The rule report (harness.jobs.rule_report) runs the reference once per stream for each release its
#: rules are judged on.  The changes up to this release are judged on the ci profile's
#: streams as 0.11.0's rules are; later ones by the replay of their release's recorded
#: traces only (tests/test_releases.py, make mutants), which keeps the report's cost flat
#: as releases are added.  Their reach by the strategies is not measured yet.
STREAM_JUDGED_UNTIL = "0.13.0"


for _change in releases.CHANGES:
    MUTANTS.append(Mutant(
        f"{_change.name}_dropped", f"{_change.since}: {_change.name}",
        _CHANGE_MODULES[_change.name],
        replace(rconfig.Config, "has", _without(_change.name), question=True),
        side=f"release {_change.since}", applies=_CHANGE_APPLIES.get(_change.name),
        checked_by="streams" if releases.order(_change.since)
        <= releases.order(STREAM_JUDGED_UNTIL) else "recorded traces"))
    if _change.until is not None:
        # Kept past the release that undid it: that release's recorded traces must tell.
        MUTANTS.append(Mutant(
            f"{_change.name}_kept", f"{_change.until}: {_change.name} undone",
            _CHANGE_MODULES[_change.name],
            replace(rconfig.Config, "has", _kept(_change.name), question=True),
            side=f"release {_change.until}", applies=_CHANGE_APPLIES.get(_change.name),
            checked_by="recorded traces"))
