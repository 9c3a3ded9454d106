"""The conformance properties: one registry, read by the tests, the mutant hunt
and the strategy quality tests.

Each property is a strategy of streams on which the reference must give vLLM's
trace exactly.  ``tests/test_conformance.py`` turns each into a test named
``test_conformance_<name>``; ``harness.checks.mutants`` hunts with them in this order;
``tests/test_strategies.py`` checks that each strategy reaches the rules it
lists.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable

from hypothesis import given, seed, settings
from hypothesis.strategies import SearchStrategy

from harness.checks import strategies as st
from harness.checks.strategies import real_workloads
from harness.checks.profiles import UNSCALED


@dataclass(frozen=True)
class Property:
    name: str
    strategy: Callable[[], SearchStrategy]
    # Rules (as named by the strategy quality tests) its streams are meant to reach.
    rules: tuple[str, ...] = ()
    # Named rules (harness.jobs.rule_report) it is aimed at: its own streams reach each of them.
    targets: tuple[str, ...] = ()
    # Streams per run, as a multiple of the profile's max_examples: more for a
    # property whose target fires in fewer than one stream in twenty (not under the
    # profiles of profiles.UNSCALED).
    scale: int = 1

    @property
    def test_name(self) -> str:
        return f"test_conformance_{self.name}"

    @property
    def seed(self) -> int:
        """The seed of its streams under a derandomized profile (ci): from its name."""
        return zlib.crc32(self.name.encode())


def given_property(prop: Property, body: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    """``body`` as a hypothesis test over the property's streams.

    Under a derandomized profile the streams are seeded by the property's name
    rather than by the test function, so the conformance test and the rule
    report (``harness.jobs.rule_report``) see the same streams as long as neither fails.
    """
    test = given(prop.strategy())(body)
    if prop.scale != 1 and settings.get_current_profile_name() not in UNSCALED:
        test = settings(max_examples=settings().max_examples * prop.scale)(test)
    if settings().derandomize:
        test = seed(prop.seed)(test)
    return test


PROPERTIES: tuple[Property, ...] = (
    Property("whole_space", st.any_stream),
    Property("preemption", st.preemption_streams,
             ("preempt_fcfs", "preempt_priority", "prefix_hit_after_preemption")),
    Property("prefix_caching", st.prefix_cache_streams, ("evict",)),
    Property("chunked_prefill", st.chunked_prefill_streams, ("chunked_prefill",)),
    Property("spec_decode", st.spec_decode_streams, ("draft_rejection",)),
    Property("stops_and_aborts", st.stop_and_abort_streams,
             ("abort_waiting", "abort_running", "abort_preempted", "eos_stop",
              "stop_token_stop", "max_model_len_stop")),
    Property("crowds", st.crowd_streams, ("preempt_fcfs", "preempt_priority"),
             targets=("fcfs_victim_by_id", "priority_victim_by_id", "outputs_in_id_order")),
    Property("set_aside", st.set_aside_streams,
             targets=("set_aside_order_kept", "skipped_waiting_to_tail",
                      "chunked_off_stops_at_first_misfit_dropped", "fcfs_victim_newest_arrival")),
    Property("set_aside_threshold", st.set_aside_threshold_streams,
             targets=("set_aside_before_threshold",)),
    Property("priority_victims", st.priority_victim_streams, ("preempt_priority",),
             targets=("priority_quirk_fixed", "priority_victim_loses_its_grant_dropped")),
    Property("priority_victim_drafts", st.priority_victim_draft_streams, ("draft_rejection",),
             targets=("rejected_drafts_kept_by_victim",), scale=3),
    Property("priority_victim_windows", st.priority_victim_window_streams, ("preempt_priority",),
             targets=("window_walk_capped_to_table",)),
    Property("hybrid_groups", st.hybrid_streams, ("hybrid_hit_with_null_pages",),
             targets=("window_pages_kept", "window_edge_off_by_one", "chunk_hit_from_start",
                      "chunk_pages_kept", "chunk_frees_last_cached_page",
                      "groups_freed_last_first")),
    Property("window_hits", st.window_hit_streams, ("hybrid_hit_with_null_pages",),
             targets=("window_pages_whole_window", "window_hit_from_left",
                      "hybrid_full_hit_not_cut", "hybrid_other_hit_unbounded",
                      "cache_key_without_group"), scale=2),
    Property("draft_windows", st.draft_window_streams,
             targets=("null_page_never_cached", "mamba_draft_pages_ignored")),
    Property("lora_adapters", st.lora_streams, ("lora_set_aside",),
             targets=("lora_slots_ignored", "lora_slots_without_running",
                      "lora_same_adapter_turned_away", "lora_not_in_hash")),
    Property("structured_outputs", st.grammar_streams, ("grammar_wait", "grammar_draft_rows"),
             targets=("grammar_wait_ignored", "grammar_status_at_readiness",
                      "drafts_not_validated", "grammar_batch_running_first",
                      "bitmask_rows_not_rolled_back", "grammar_not_advanced")),
    # encoder_budget_ignored: reached by lora_encoder_skips's streams (and whole_space's);
    # multimodal's 250 ci streams stopped reaching it once hypothesis's local constants
    # were pinned out of the draws (profiles.pin_local_constants).
    Property("multimodal", st.mm_streams, ("encoder_cut",),
             targets=("encoder_outputs_not_shared",)),
    Property("encoder_pressure", st.encoder_pressure_streams, ("encoder_cut",),
             targets=("encoder_evicts_newest", "encoder_outputs_held_to_the_end",
                      "chunked_mm_input_allowed"), scale=4),
    Property("encoder_preemption", st.encoder_preemption_streams,
             targets=("preempted_keeps_encoder_outputs",)),
    Property("mm_prefix_hits", st.mm_hash_streams,
             targets=("mm_hash_not_in_block_hash", "mm_item_ending_at_block_start_skipped",
                      "mm_later_hashing_from_first_item"), scale=2),
    # Rules of later releases (no target of 0.11.0's here), which the whole-space streams
    # never decide (docs/upgrading.md); of their 250 ci streams, the reference of the
    # rule's release decides items_taken_per_request (0.23.0) on 143 and
    # held_to_last_occurrence (0.29.0) on 21; encoder_frees_wait_for_outputs (0.20.0) on 160
    # and placeholder_tokens_hold_encoder_outputs (0.24.0) on 88;
    # sending_requests_keep_the_engine_stepping (0.22.0) on 75;
    # passed_over_victim_keeps_the_pass (0.28.0) on 31.
    Property("repeated_images", st.repeated_image_streams),
    Property("encoder_handoffs", st.encoder_handoff_streams),
    Property("connector_idles", st.connector_idle_streams),
    Property("passed_over_victims", st.passed_over_victim_streams),
    Property("lora_encoder_skips", st.lora_encoder_skip_streams, ("lora_overfill",),
             targets=("lora_overfill_not_asserted", "encoder_budget_ignored")),
    Property("pooling", st.pooling_streams, ("pooled_after_chunks",),
             targets=("pooled_request_runs_on",)),
    Property("connector_sends", st.connector_send_streams,
             targets=("abort_skips_finished_requests_dropped",)),
    Property("async_scheduling", st.async_streams,
             targets=("batch_applied_at_once", "worker_done_not_looked_at",
                      "empty_batch_does_not_wait", "placeholders_not_scheduled",
                      "sampling_ignores_placeholders", "async_outputs_not_cached",
                      "placeholders_kept_after_output"), scale=3),
    Property("real_workloads", real_workloads.real_workload_streams),
    Property("pipeline_parallel", st.pipeline_streams,
             targets=("pipeline_stages_ignored", "batch_applied_at_once")),
)


def by_name(name: str) -> Property:
    return next(p for p in PROPERTIES if p.name == name)
