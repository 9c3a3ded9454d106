"""Mutants of what requests bring besides tokens: LoRA adapters, structured output and
multimodal inputs."""

from __future__ import annotations

from harness.checks.mutants.applies import (
    chunked_mm_off,
    encoder,
    encoder_and_caching,
    grammar,
    grammar_drafts,
    lora,
    pooling,
)
from harness.checks.mutants.registry import mutant
from harness.formats.mutant import KV_CACHE_UTILS, SCHEDULER, STRUCTURED_OUTPUT
from reference import block_hash as rhash
from reference import encoder_cache as renc
from reference import encoder_inputs as rencin
from reference import lora as rlora
from reference import scheduler as rsched
from reference import structured_output as rso
from reference.request import RequestStatus


@mutant("lora_slots_ignored", "a waiting request whose adapter finds no free slot is set aside",
        SCHEDULER, replaces=(rlora.AdapterSlots, "turns_away"), applies=lora)
def _never_turned_away(self, request):
    return False


_adapter_slots_init = rlora.AdapterSlots.__init__


@mutant("lora_slots_without_running", "the running requests' adapters fill the step's slots first",
        SCHEDULER, replaces=(rlora.AdapterSlots, "__init__"), applies=lora)
def _slots_start_empty(self, max_loras, scheduled_running):
    _adapter_slots_init(self, max_loras, ())


@mutant("pooled_request_runs_on", "a pooling request finishes once the model hands back its "
        "pooled output", SCHEDULER, replaces=(rsched, "check_pooled"), applies=pooling)
def _never_pooled(request):
    return False


@mutant("lora_overfill_not_asserted", "a step whose running requests hold more adapters than "
        "max_loras fails vLLM's assertion", SCHEDULER,
        replaces=(rlora.AdapterSlots, "check_not_overfilled"),
        quirk="LORA_SLOTS_OVERFILLED_AFTER_A_SKIP", applies=lora)
def _overfill_allowed(self):
    return None


@mutant("lora_same_adapter_turned_away", "a request whose adapter is already in the step joins it",
        SCHEDULER, replaces=(rlora.AdapterSlots, "turns_away"), applies=lora)
def _full_slots_turn_everyone_away(self, request):
    return (self.max_loras is not None and request.lora_id is not None
            and len(self.ids) == self.max_loras)


@mutant("grammar_wait_ignored", "a request waits in WAITING_FOR_FSM until its grammar is ready",
        SCHEDULER, replaces=(rsched.Scheduler, "waits_for_grammar"), applies=grammar)
def _grammar_never_awaited(self, request):
    if request.status == RequestStatus.WAITING_FOR_FSM:
        request.status = RequestStatus.WAITING
    return False


_schedule = rsched.Scheduler.schedule


@mutant("grammar_status_at_readiness", "WAITING_FOR_FSM ends when the scheduler reaches the "
        "request with its grammar ready, not when the grammar compiles", SCHEDULER,
        replaces=(rsched.Scheduler, "schedule"), applies=grammar)
def _status_flips_on_compile(self):
    for request in self.requests.values():
        if request.status == RequestStatus.WAITING_FOR_FSM and request.grammar.ready:
            request.status = RequestStatus.WAITING
    return _schedule(self)


@mutant("drafts_not_validated", "drafts are cut before the first token the grammar rejects",
        SCHEDULER, replaces=(rso.Grammar, "validate"), applies=grammar_drafts)
def _every_draft_valid(self, tokens):
    return list(tokens)


@mutant("grammar_batch_running_first", "the worker's batch lists new, then running, then "
        "resumed requests", SCHEDULER, replaces=(rsched.Scheduler, "worker_batch"), applies=grammar)
def _running_first(self, plan):
    return plan.running + plan.new + plan.resumed


@mutant("bitmask_rows_not_rolled_back", "the grammar steps back after filling a request's rows",
        STRUCTURED_OUTPUT, replaces=(rso.Grammar, "rollback"), applies=grammar_drafts)
def _no_rollback(self, num_tokens):
    return None


@mutant("grammar_not_advanced", "the tokens a constrained request emits advance its grammar",
        SCHEDULER, replaces=(rso.Grammar, "accept"), applies=grammar)
def _outputs_not_accepted(self, tokens):
    return None


@mutant("mm_hash_not_in_block_hash", "the content hashes of the items a block touches are "
        "extra keys of the block", KV_CACHE_UTILS, replaces=(rhash, "mm_keys"),
        applies=encoder_and_caching)
def _no_mm_keys(items, start, end, item, with_offset=False):
    return (), item


@mutant("mm_item_ending_at_block_start_skipped", "an item ending exactly where a block starts "
        "counts as touching it", KV_CACHE_UTILS, replaces=(rhash, "ended_before"),
        quirk="MM_HASH_ON_BLOCK_AFTER_A_LATER_HASHING", applies=encoder_and_caching)
def _ended_at_or_before(item, start, with_offset=False):
    return start >= item.offset + item.length


@mutant("mm_later_hashing_from_first_item", "a later hashing looks only at the last item",
        KV_CACHE_UTILS, replaces=(rhash, "first_item_to_look_at"), applies=encoder_and_caching)
def _always_from_the_first_item(items, start, every_item=False, with_offset=False):
    return 0


_try_encode = rencin.try_schedule_encoder_inputs


@mutant("encoder_budget_ignored", "the encoder runs at most encoder_compute_budget tokens a step",
        SCHEDULER, replaces=(rsched, "try_schedule_encoder_inputs"), applies=encoder)
def _unbounded_encoder(request, num_computed, num_new, budget, cache, **kw):
    encode, num_new, _ = _try_encode(request, num_computed, num_new, 1 << 30, cache, **kw)
    return encode, num_new, budget


@mutant("encoder_budget_not_raised_to_largest_item", "the encoder budget and cache are raised "
        "to the model's largest item", "vllm/v1/core/encoder_cache_manager.py",
        replaces=(rsched, "encoder_budgets"), applies=encoder)
def _configured_sizes(max_tokens_by_modality, *, max_num_encoder_input_tokens,
                      encoder_cache_size, **kw):
    if not max_tokens_by_modality:
        return 0, 0
    return max_num_encoder_input_tokens, encoder_cache_size


@mutant("encoder_outputs_not_shared", "an item whose content is in the encoder cache is not "
        "encoded again", "vllm/v1/core/encoder_cache_manager.py",
        replaces=(renc.EncoderCacheManager, "check_and_update_cache"), applies=encoder)
def _never_cached(self, request, input_id):
    return False


@mutant("encoder_evicts_newest", "the encoder cache evicts the entry freeable longest first",
        "vllm/v1/core/encoder_cache_manager.py",
        replaces=(renc.EncoderCacheManager, "evict_until"), applies=encoder)
def _evict_newest(self, needed):
    while self.num_free_slots < needed:
        mm_hash = next(reversed(self.freeable))
        self.num_free_slots += self.freeable.pop(mm_hash)
        del self.holders[mm_hash]
        self.freed.append(mm_hash)


@mutant("encoder_outputs_held_to_the_end", "a request lets go of an encoder output once its "
        "placeholder is computed", SCHEDULER, replaces=(rsched, "free_encoder_inputs"),
        applies=encoder)
def _held_until_finished(request, num_computed, cache, **kw):
    return None


@mutant("chunked_mm_input_allowed", "with disable_chunked_mm_input a placeholder is computed "
        "in one step", SCHEDULER, replaces=(rencin, "cut_to_whole_item"), applies=chunked_mm_off)
def _never_cut_to_whole(item, num_computed, range_end, from_its_start=False, from_inside=False):
    return False


@mutant("preempted_keeps_encoder_outputs", "a preempted request lets go of its encoder outputs",
        SCHEDULER, replaces=(rsched.Scheduler, "_preempt"), applies=encoder)
def _preempt_keeping_encoder(self, victim, plan):
    self.kv.free(victim)
    victim.status = RequestStatus.PREEMPTED
    victim.num_computed_tokens = 0
    self.waiting.prepend(victim)
    plan.preempted.append(victim)
    self.emit(rsched.events.Preempted(victim.request_id))
