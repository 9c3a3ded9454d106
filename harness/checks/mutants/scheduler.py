"""Mutants of the scheduler: running requests and preemption, waiting requests,
speculative decoding, stops and the output."""

from __future__ import annotations

import dataclasses
import heapq

from harness.checks.mutants.applies import (
    chunked_off_threshold,
    drafts,
    eagle,
    fcfs,
    priority,
    priority_drafts,
    threshold,
)
from harness.checks.mutants.registry import mutant, register
from harness.formats.mutant import (
    REQUEST,
    REQUEST_QUEUE,
    SCHED_UTILS,
    SCHEDULER,
    WORKER_BLOCK_TABLE,
)
from reference import config as rconfig
from reference import request as rreq
from reference import request_queue as rq
from reference import scheduler as rsched
from reference import slot_mapping as rslots
from reference.request import RequestStatus


@mutant("fcfs_preempt_first_running", "fcfs preempts the last running request", SCHEDULER,
        replaces=(rsched.Scheduler, "fcfs_victim"), applies=fcfs)
def _first_running(self):
    return self.running[0]


@mutant("priority_victim_by_arrival_only", "priority victim is the max (priority, arrival)",
        SCHEDULER, replaces=(rsched.Scheduler, "priority_victim"), applies=priority)
def _newest_running(self):
    return max(self.running, key=lambda r: r.arrival_time)


@mutant("waiting_admitted_after_preemption",
        "no waiting request is admitted in a step that preempted", SCHEDULER,
        replaces=(rsched.Scheduler, "admits_waiting"))
def _always_admits(self, plan):
    return True


@mutant("priority_quirk_fixed", "0.11.0 keeps a preempted victim's grant (fixed by PR #26661)",
        SCHEDULER, replaces=(rconfig.Config, "has"), quirk="PRIORITY_VICTIM_KEEPS_ITS_GRANT",
        applies=priority)
def _with_0_11_1_victim_rule(self, rule_change):
    """vLLM 0.11.1's priority_victim_loses_its_grant, applied to 0.11.0."""
    return rule_change == "priority_victim_loses_its_grant" or rule_change in self.rules


@mutant("fcfs_victim_newest_arrival", "fcfs preempts the request that joined the running list last",
        SCHEDULER, replaces=(rsched.Scheduler, "fcfs_victim"), applies=fcfs)
def _newest_arrival(self):
    return max(self.running, key=lambda r: r.arrival_time)


@mutant("fcfs_victim_by_id", "fcfs preempts by running order, never by request id", SCHEDULER,
        replaces=(rsched.Scheduler, "fcfs_victim"), applies=fcfs)
def _largest_id(self):
    return max(self.running, key=lambda r: r.request_id)


@mutant("priority_victim_by_id", "priority ties are broken by arrival_time, not by request id",
        SCHEDULER, replaces=(rsched.Scheduler, "priority_victim"), applies=priority)
def _priority_then_id(self):
    return max(self.running, key=lambda r: (r.priority, r.request_id))


@mutant("priority_queue_by_id", "the priority queue orders by (priority, arrival_time)",
        REQUEST_QUEUE, replaces=(rq.PriorityQueue, "add"), applies=priority)
def _queue_by_priority_then_id(self, request):
    heapq.heappush(self, (request.priority, request.request_id, id(request), request))


_update_from_output = rsched.Scheduler.update_from_output


@mutant("outputs_in_id_order", "outputs are taken in the step's scheduling order", SCHEDULER,
        replaces=(rsched.Scheduler, "update_from_output"))
def _outputs_sorted_by_id(self, output, sampled, *args, **kwargs):
    by_id = dict(sorted(output.num_scheduled_tokens.items()))
    return _update_from_output(self, dataclasses.replace(output, num_scheduled_tokens=by_id),
                               sampled, *args, **kwargs)


@mutant("model_len_cap_off_by_one", "tokens are capped at max_model_len - 1 - computed",
        SCHEDULER, replaces=(rsched.Scheduler, "cap_model_len"))
def _cap_at_max_model_len(self, request, num_tokens):
    return min(num_tokens, self.config.max_model_len - request.num_computed_tokens)


_preempt = rsched.Scheduler._preempt


@mutant("preempted_keep_progress", "a preempted request's num_computed_tokens drops to 0",
        SCHEDULER, replaces=(rsched.Scheduler, "_preempt"))
def _preempt_keeping_progress(self, victim, plan):
    computed = victim.num_computed_tokens
    _preempt(self, victim, plan)
    victim.num_computed_tokens = min(computed, victim.num_tokens - 1)


@mutant("threshold_ignored_when_waiting", "the long-prefill threshold caps waiting requests too",
        SCHEDULER, replaces=(rsched.Scheduler, "waiting_tokens"), applies=threshold)
def _uncapped_waiting(self, request, num_computed, padding=0):
    return request.num_tokens - num_computed + padding


@mutant("max_num_seqs_off_by_one", "at most max_num_seqs requests run", SCHEDULER,
        replaces=(rsched.Scheduler, "has_free_seat"))
def _one_seat_too_many(self):
    return len(self.running) <= self.config.max_num_seqs


@mutant("skipped_waiting_to_tail", "with chunked prefill off, skipped requests go back to the head",
        REQUEST_QUEUE, replaces=(rq.FcfsQueue, "prepend_all"), applies=None)
def _to_the_tail(self, other, reverse=False):
    for request in other:
        self.add(request)


@mutant("set_aside_order_kept", "requests set aside in one step come back reversed (fcfs)",
        SCHEDULER, replaces=(rsched.Scheduler, "set_aside"),
        quirk="SKIPPED_WAITING_REQUESTS_REVERSED", applies=None)
def _set_aside_in_order(self, set_aside, request):
    set_aside.add(request)


_waiting_tokens = rsched.Scheduler.waiting_tokens


@mutant("set_aside_before_threshold",
        "with chunked prefill off, the whole-prompt test sees the threshold-capped count",
        SCHEDULER, replaces=(rsched.Scheduler, "waiting_grant"), applies=chunked_off_threshold)
def _whole_prompt_test_first(self, request, num_computed, plan, padding=0):
    uncapped = request.num_tokens - num_computed + padding
    if self.sets_aside(uncapped, plan):
        return None
    return min(_waiting_tokens(self, request, num_computed, padding), plan.token_budget)


register("resumed_prompt_only", "a resumed request recomputes prompt and outputs", REQUEST,
         (rreq.Request, "num_tokens"),
         property(lambda r: len(r.all_token_ids) if r.status != RequestStatus.PREEMPTED
                  else len(r.prompt_token_ids)))


register("eagle_no_lookahead", "eagle reserves num_speculative_tokens lookahead slots", SCHEDULER,
         (rsched.Config, "num_lookahead_tokens"), property(lambda c: 0), applies=eagle)


_num_scheduled_drafts = rsched.Scheduler.num_scheduled_drafts


@mutant("drafts_not_trimmed", "scheduled drafts are trimmed to the granted tokens", SCHEDULER,
        replaces=(rsched.Scheduler, "num_scheduled_drafts"), applies=drafts)
def _every_draft(self, request, num_new):
    return len(request.spec_token_ids) if _num_scheduled_drafts(self, request, num_new) > 0 else 0


@mutant("rejected_drafts_not_subtracted",
        "rejected drafts are taken back from num_computed_tokens", SCHEDULER,
        replaces=(rsched.Scheduler, "num_rejected"), applies=drafts)
def _none_rejected(self, drafts, tokens):
    return 0


_take_back_rejected = rsched.Scheduler._take_back_rejected


@mutant("rejected_drafts_kept_by_victim",
        "rejected drafts are subtracted even from a request preempted in the same step",
        SCHEDULER, replaces=(rsched.Scheduler, "_take_back_rejected"),
        quirk="REJECTED_DRAFTS_ALWAYS_SUBTRACTED", applies=priority_drafts)
def _only_while_running(self, request, drafts, tokens):
    if request.status == RequestStatus.RUNNING:
        _take_back_rejected(self, request, drafts, tokens)


@mutant("tokens_after_stop_kept", "tokens after a stop are dropped", SCHEDULER,
        replaces=(rsched.Scheduler, "_append_outputs"))
def _append_past_stop(self, request, tokens):
    stopped = False
    for token in tokens:
        request.append_output_token(token)
        stopped = rsched.check_stop(request, self.config.max_model_len,
                                    self.config.has("stop_tokens_before_length")) or stopped
    return tokens, stopped


@mutant("eos_ignored", "EOS stops a request unless ignore_eos", SCHED_UTILS,
        replaces=(rreq, "stopped_by_eos"))
def _never_eos(request):
    return False


@mutant("finished_reported_again", "finished ids are reported once, on the next step", SCHEDULER,
        replaces=(rsched.Scheduler, "_forget_reported_finished"))
def _remember_finished(self):
    self.finished_req_ids = set(self.finished_req_ids)


@mutant("slot_offset_ignored", "a token's slot is page * block_size + its offset in the page",
        WORKER_BLOCK_TABLE, replaces=(rslots.WorkerBlockTable, "slot_of"))
def _page_start(self, table, position):
    return table[position // self.block_size] * self.block_size
