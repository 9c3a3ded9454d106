"""The reference's mutants as they are registered: the list, the decorator that puts a
mutant right above the function replacing its rule, and the mutants whose site only
answers a question.

Every mutant is registered with ``@mutant(name, rule, mirrors, replaces=(owner,
attribute))``, where ``rule`` states the rule as the original keeps it and ``mirrors`` is
the vLLM 0.11.0 module it lives in.  The replacement is active only inside
``mutant.patch()``."""

from __future__ import annotations

from harness.formats.mutant import Mutant, replace

MUTANTS: list[Mutant] = []


#: Mutants whose site only answers a question -- it reads what it is given and changes
#: nothing -- and whose replacement does the same (harness.formats.mutant.Replacement.question):
#: the rule report compares the two answers call by call instead of running the mutant
#: on every stream (harness.checks.rule_watch).  tests/test_reach.py checks the claim.
QUESTIONS = frozenset({
    "evict_from_tail", "hit_without_last_token_cap", "hit_on_partial_block",
    "prompt_logprobs_get_hits", "cache_salt_ignored", "lora_not_in_hash",
    "free_hits_not_counted", "window_pages_whole_window", "window_hit_from_left",
    "chunk_hit_from_start", "mamba_draft_pages_ignored", "hybrid_full_hit_not_cut",
    "hybrid_other_hit_unbounded", "cache_key_without_group", "reset_prefix_cache_always",
    "fcfs_preempt_first_running", "fcfs_victim_newest_arrival", "fcfs_victim_by_id",
    "priority_victim_by_arrival_only", "priority_victim_by_id",
    "waiting_admitted_after_preemption", "priority_quirk_fixed", "model_len_cap_off_by_one",
    "threshold_ignored_when_waiting", "max_num_seqs_off_by_one", "set_aside_before_threshold",
    "resumed_prompt_only", "eagle_no_lookahead", "drafts_not_trimmed",
    "rejected_drafts_not_subtracted", "eos_ignored", "slot_offset_ignored",
    "lora_slots_ignored", "lora_same_adapter_turned_away", "drafts_not_validated",
    "grammar_batch_running_first", "mm_hash_not_in_block_hash",
    "mm_item_ending_at_block_start_skipped", "mm_later_hashing_from_first_item",
    "encoder_budget_not_raised_to_largest_item", "chunked_mm_input_allowed",
    "stats_usage_counts_null_page", "kv_event_parent_dropped", "kv_events_with_lora_run",
    "loaded_last_token_not_recomputed", "engine_steps_while_idle",
    "finished_told_only_with_work", "batch_applied_at_once", "worker_done_not_looked_at",
    "empty_batch_does_not_wait", "pipeline_stages_ignored", "placeholders_not_scheduled",
    "sampling_ignores_placeholders",
})


def mutant(name: str, rule: str, mirrors: str, replaces: tuple[object, str], quirk: str = "",
           checked_by: str = "streams", applies=None):
    """Register the decorated function as the replacement of ``replaces``.

    ``quirk`` names the ``reference.quirks`` entry the mutant takes away;
    ``checked_by`` and ``applies`` are those of ``Mutant``."""
    def register(fn):
        MUTANTS.append(Mutant(name, rule, mirrors, replace(*replaces, fn, name in QUESTIONS),
                              quirk=quirk, checked_by=checked_by, applies=applies))
        return fn
    return register


def register(name: str, rule: str, mirrors: str, replaces: tuple[object, str], new,
             applies=None) -> None:
    """Register a replacement that is not a function (a property, a constant)."""
    MUTANTS.append(Mutant(name, rule, mirrors, replace(*replaces, new, name in QUESTIONS),
                          applies=applies))
