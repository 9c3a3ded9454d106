"""The rule report (harness.jobs.rule_report): no named rule is a blind spot of the ci profile.

A rule is reached by a stream when its mutant changes the stream's trace in
the reference.  The ci profile's streams (exactly those the conformance tests
generate) must reach every rule at least ``FLOOR`` times; the report below
fails naming each rule that falls short.  Nothing here needs vLLM.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.checks.mutants import REFERENCE_MUTANTS
from harness.formats.paths import STREAMS_DIR
from harness.checks.properties import PROPERTIES
from harness.jobs.rule_report import (FLOOR, broken_skips, floor_message, named_rules, reach_of_profile,
                           rules_reached)
from harness.formats.stream import load_stream, parse_stream
from reference import quirks

pytestmark = pytest.mark.selftest

RULES = {r.name: r for r in named_rules()}

# Bundled fixtures named after a rule, and the rule's mutant that must change their trace.
FIXTURE_SHOWS = {
    "mm_chunked_input_disabled": ["chunked_mm_input_allowed"],
    "mm_encoder_budget_cuts_prefill": ["encoder_budget_ignored"],
    "mm_encoder_budget_raised_to_largest_item": ["encoder_budget_not_raised_to_largest_item"],
    "lora_slots_overfilled_after_a_skip": ["lora_overfill_not_asserted"],
    "pooling_finishes_after_prefill": ["pooled_request_runs_on"],
    "stats_prefix_cache_lookups": ["stats_count_skipped_lookups", "stats_queries_capped",
                                   "stats_prefix_cache_cumulative",
                                   "stats_usage_counts_null_page", "stats_reset_not_reported"],
    "stats_spec_decoding": ["stats_drafted_positions_counted", "stats_spec_decoding_always"],
    "stats_preempted_lookup": ["prefix_stats_split_preempted_dropped"],
    "kv_events_stored_and_removed": ["kv_event_parent_dropped", "kv_event_removal_not_sent",
                                     "kv_event_stored_per_page", "kv_event_tokens_from_first_page",
                                     "kv_event_removed_on_free"],
    "kv_events_reset_clears_all": ["kv_event_clear_not_sent"],
    "kv_connector_async_load": ["remote_kv_not_awaited", "loaded_last_token_not_recomputed",
                                "connector_asked_after_load", "async_load_cached_at_once"],
    "kv_connector_sync_load_after_hit": ["unknown_answer_taken_as_zero",
                                         "connector_told_new_pages_only"],
    "kv_connector_abort_while_sending": ["abort_skips_finished_requests_dropped"],
    "async_one_batch_ahead": ["batch_applied_at_once", "placeholders_not_scheduled",
                              "sampling_ignores_placeholders", "placeholders_kept_after_output",
                              "async_skips_requests_at_max_tokens_dropped"],
    "async_worker_done_at_once": ["worker_done_not_looked_at", "empty_batch_does_not_wait"],
    "async_output_pages_cached_when_applied": ["async_outputs_not_cached",
                                               "kv_events_published_after_update_dropped"],
    "async_preempted_while_in_flight": ["placeholders_kept_after_output"],
    "async_priority_victim_crash": ["priority_victim_loses_its_grant_dropped"],
    "pipeline_parallel_three_stages": ["pipeline_stages_ignored", "batch_applied_at_once"],
    "kv_connector_pages_kept_for_sending": ["kept_pages_freed_at_once", "send_report_ignored"],
    "kv_events_with_lora": ["kv_events_with_lora_run", "kv_events_name_the_adapter_dropped"],
    "mm_eagle_reads_one_token_ahead": ["eagle_encoder_one_token_ahead_dropped",
                                       "eagle_lookahead_item_waits_dropped"],
    "mm_encoder_cache_evicts_oldest": ["encoder_outputs_not_shared", "encoder_evicts_newest"],
    "mm_encoder_cache_shared": ["encoder_outputs_not_shared"],
    "mm_encoder_output_let_go_after_placeholder": ["encoder_outputs_held_to_the_end"],
    "mm_hash_in_block_hash": ["mm_hash_not_in_block_hash"],
    "mm_hash_quirk_block_after_placeholder": ["mm_hash_not_in_block_hash",
                                              "mm_item_ending_at_block_start_skipped"],
    "mm_preempted_lets_go_of_encoder_output": ["preempted_keeps_encoder_outputs"],
    "mm_later_hashing_sees_last_item_only": ["mm_hash_not_in_block_hash",
                                             "mm_later_hashing_from_first_item",
                                             "encoder_outputs_not_shared"],
    "grammar_batch_new_first": ["grammar_batch_running_first",
                                "grammar_rows_in_grant_order_dropped"],
    "grammar_cuts_drafts": ["drafts_not_validated", "bitmask_rows_not_rolled_back",
                            "grammar_not_advanced"],
    "grammar_waits_for_fsm": ["grammar_wait_ignored", "grammar_status_at_readiness"],
    "lora_adapter_in_block_hash": ["lora_not_in_hash"],
    "lora_full_slots_set_aside": ["lora_slots_ignored", "lora_same_adapter_turned_away"],
    "lora_running_adapter_holds_slot": ["lora_slots_without_running"],
    "block_table_free_queue_order": ["free_forward_order"],
    "cached_page_loses_hash_on_reuse": ["hash_kept_on_reuse"],
    "chunked_prefill_off_set_aside_reversed": ["set_aside_order_kept"],
    "chunked_prefill_off_skip_keeps_head": ["skipped_waiting_to_tail"],
    "evict_cached_lru_tail_first": ["evict_from_tail"],
    "fcfs_preempt_last_running": ["fcfs_preempt_first_running"],
    "fcfs_victim_last_to_join": ["fcfs_victim_newest_arrival"],
    "finished_reported_next_step": ["finished_reported_again"],
    "hit_on_free_page_counts": ["free_hits_not_counted"],
    "long_prefill_threshold": ["threshold_ignored_when_waiting"],
    "max_model_len_cap_minus_one": ["model_len_cap_off_by_one"],
    "max_num_seqs_limit": ["max_num_seqs_off_by_one"],
    "prefix_cache_salt": ["cache_salt_ignored"],
    "prefix_hit_cap_num_tokens_minus_one": ["hit_without_last_token_cap"],
    "priority_preempt_already_scheduled_quirk": ["priority_quirk_fixed",
                                                 "priority_victim_loses_its_grant_dropped"],
    "priority_preempt_max_priority": ["priority_victim_by_arrival_only"],
    "priority_victim_rejected_drafts_quirk": ["rejected_drafts_kept_by_victim"],
    "priority_victim_window_index_error": ["window_walk_capped_to_table"],
    "prompt_logprobs_no_hit": ["prompt_logprobs_get_hits"],
    "reset_prefix_cache": ["reset_prefix_cache_always"],
    "resumed_recomputes_outputs": ["resumed_prompt_only"],
    "seed_fcfs_preempt_recompute": ["preempted_keep_progress"],
    "set_aside_threshold_caps_first": ["set_aside_before_threshold"],
    "sliding_window_null_page_cached": ["null_page_never_cached"],
    "hybrid_full_and_two_windows_hit": ["window_hit_from_left", "window_pages_kept",
                                        "cache_key_without_group"],
    "hybrid_chunked_local_hit_and_free": ["chunk_hit_from_start", "chunk_pages_kept"],
    "hybrid_chunked_local_last_cached_page_freed": ["chunk_frees_last_cached_page",
                                                    "chunked_local_frees_last_cached_page_dropped"],
    "hybrid_mamba_draft_pages": ["mamba_draft_pages_ignored"],
    "hybrid_sliding_window_preempt": ["window_edge_off_by_one", "groups_freed_last_first",
                                      "hybrid_full_hit_not_cut", "hybrid_other_hit_unbounded"],
    "spec_drafts_capped_by_max_tokens": ["running_tokens_capped_by_max_tokens_dropped"],
    "spec_drafts_trimmed_to_budget": ["drafts_not_trimmed"],
    "spec_eagle_lookahead_drop_last_hit": ["eagle_no_lookahead", "eagle_keeps_last_hit"],
    "spec_ngram_partial_accept": ["rejected_drafts_not_subtracted"],
    "stop_eos": ["eos_ignored"],
    "stop_eos_on_last_allowed_token": ["stop_tokens_before_length_dropped"],
    "threshold_without_chunking_or_caching": ["threshold_dropped_when_nothing_chunks_dropped"],
    "waiting_blocked_after_preemption": ["waiting_admitted_after_preemption"],
}


@pytest.fixture(scope="module")
def ci_reach():
    """The ci profile's report, each rule counted up to the floor (the floor check is
    exact; about 4 minutes of one core)."""
    report = reach_of_profile("ci", enough=FLOOR)
    print("\n" + report.table())
    return report


@pytest.mark.xdist_group("ci_reach")  # one worker builds the report for both tests
def test_ci_profile_reaches_every_rule(ci_reach):
    """Every named rule: reached by at least FLOOR streams of the ci profile."""
    per_property = settings.get_profile("ci").max_examples
    assert ci_reach.streams == sum(per_property * p.scale for p in PROPERTIES)
    message = floor_message(ci_reach)
    assert message is None, "\n" + message


@pytest.mark.xdist_group("ci_reach")
def test_targeted_properties_reach_their_targets(ci_reach):
    """A targeted strategy reaches each rule it was written for on its own."""
    missed = [f"{p.name}: {t}" for p in PROPERTIES for t in p.targets
              if ci_reach.by_property[p.name][t] == 0]
    assert not missed


def test_counting_up_to_enough_caps_each_count_and_nothing_else():
    """enough=k: each rule's count is the full count capped at k (same streams)."""
    from harness.checks.properties import by_name
    props = [by_name("stops_and_aborts")]
    full = reach_of_profile("ci", properties=props, examples=25)
    capped = reach_of_profile("ci", properties=props, examples=25, enough=2)
    assert any(n > 2 for n in full.counts.values())
    assert {r: min(n, 2) for r, n in full.counts.items()} == dict(capped.counts)


@pytest.mark.xdist_group("ci_reach")
def test_floor_names_the_rule_when_a_strategy_is_disabled(ci_reach):
    """Without its targeted strategy, a rule falls below the floor, by name.

    The later-hashing rule needs a prefix hit on a prompt whose unfinished page holds
    two images, which only the mm_prefix_hits strategy builds.  The report counts the
    properties in order and stops judging a rule at the floor: the counts of the
    properties before mm_prefix_hits are read off it (they stayed below the floor, so
    none was cut); those after it are counted again, for this rule alone, uncut.
    """
    from harness.checks.properties import by_name
    from harness.jobs.rule_report import Reach
    rule = "mm_later_hashing_from_first_item"
    targeted = PROPERTIES.index(by_name("mm_prefix_hits"))
    before, after = PROPERTIES[:targeted], PROPERTIES[targeted + 1:]
    assert ci_reach.by_property["mm_prefix_hits"][rule] >= 1
    report = Reach([rule])
    for p in before:
        report.add([rule] * ci_reach.by_property[p.name][rule], p.name)
    assert report.counts[rule] < FLOOR  # so no count of these was cut
    report.merge(reach_of_profile("ci", properties=after, rule_names=[rule], workers=1))
    assert report.counts[rule] < FLOOR
    message = floor_message(report)
    assert message is not None and message.startswith(f"rule {rule}: reached by ")


def test_every_quirk_has_a_mutant():
    names = re.findall(r"^([A-Z][A-Z_]+)$", quirks.__doc__, re.MULTILINE)
    assert names, "no quirk found in reference/quirks.py"
    by_quirk = {m.quirk: m for m in REFERENCE_MUTANTS if m.quirk}
    assert sorted(by_quirk) == sorted(names)


def test_every_rule_is_judged_somewhere():
    """A rule is judged by streams or by the KV sizing check; a rule change of a release
    after STREAM_JUDGED_UNTIL by that release's recorded traces alone (its mutant is
    killed by their replay: tests/test_releases.py), and so is the end of any rule change
    (its ``_kept`` mutant, by the replay of the release that undid it); nothing else."""
    from harness.checks.mutants.releases import STREAM_JUDGED_UNTIL
    from reference.releases import order
    for rule in RULES.values():
        if rule.mutant.checked_by == "recorded traces":
            assert rule.mutant.release is not None, rule.name
            assert rule.name.endswith("_kept") or \
                order(rule.mutant.release) > order(STREAM_JUDGED_UNTIL), rule.name
        else:
            assert rule.mutant.checked_by in {"streams", "kv sizing"}, rule.name
    named = {name for names in FIXTURE_SHOWS.values() for name in names}
    assert named <= set(RULES), sorted(named - set(RULES))


@pytest.mark.parametrize("fixture", sorted(FIXTURE_SHOWS))
def test_bundled_fixture_shows_its_rule(fixture):
    """The fixture's trace changes under the mutant of the rule it is named after."""
    stream = load_stream(STREAMS_DIR / f"{fixture}.json")
    rules = [RULES[name] for name in FIXTURE_SHOWS[fixture]]
    assert rules_reached(stream, rules) == FIXTURE_SHOWS[fixture]


@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.one_of(*[p.strategy() for p in PROPERTIES]))
def test_skipped_runs_could_not_have_changed_the_trace(data):
    """Mutant.applies and the watch (harness.checks.rule_watch): where either says a mutant cannot
    matter, the mutant changes nothing, and watching changes no trace."""
    assert broken_skips(parse_stream(data), list(RULES.values())) == []


def test_a_false_question_is_caught():
    """broken_skips can fail: a mutant whose replacement changes state, declared a
    question, makes the watched run differ (its replacement is called beside the site)."""
    import dataclasses
    from harness.formats.mutant import Replacement
    rule = RULES["tokens_after_stop_kept"]
    p = rule.mutant.patch
    lying = dataclasses.replace(rule, mutant=dataclasses.replace(
        rule.mutant, patch=Replacement(p.owner, p.attr, p.new, question=True)))
    stream = load_stream(STREAMS_DIR / "seed_fcfs_preempt_recompute.json")
    assert broken_skips(stream, [lying])


def test_a_run_held_to_a_trace_stops_where_it_leaves_it():
    """runner.run(like=trace), as rules_reached runs a mutant: held to its own trace a run
    is the plain run; held to the trace of the unbroken rule, a mutant's run stops right
    after the first step that differs (verdict unlike)."""
    from harness.engines import get_engine
    from harness.loop.runner import UNLIKE, run
    stream = load_stream(STREAMS_DIR / "seed_fcfs_preempt_recompute.json")
    engine = get_engine("reference")
    plain = run(engine, stream)
    assert run(engine, stream, like=plain).to_json() == plain.to_json()
    with RULES["preempted_keep_progress"].mutant.patch():
        mutated = run(engine, stream)
        held = run(engine, stream, like=plain)
    first = next(i for i, (a, b) in enumerate(zip(plain.steps, mutated.steps)) if a != b)
    assert first + 1 < len(mutated.steps)  # the stop saves steps
    assert held.verdict == UNLIKE and held.steps == mutated.steps[:first + 1]
