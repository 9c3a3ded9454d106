"""The step scheduler: who computes how many tokens now, and on which pages.

Mirrors: vllm/v1/core/sched/scheduler.py (Scheduler.schedule,
_update_after_schedule, update_from_output, update_draft_token_ids,
finish_requests).

There is no prefill or decode phase.  Each request has ``num_tokens_with_spec``
(prompt + outputs + drafts) and ``num_computed_tokens`` (KV already written);
a step grants it the difference, cut by the long-prefill threshold, by what
is left of the step's token budget and by the model length.  A step has three
parts:

1. running requests, in running order, each getting pages or preempting the
   lowest-priority running request until it does (or until it preempts itself);
2. waiting requests, only if nothing was preempted, while budget and seats
   remain, each with its prefix hit; one that does not fit ends the part,
   while one whose grammar is not ready, whose LoRA adapter finds no free
   slot, or (chunked prefill off) whose prompt does not fit whole is set
   aside for a later step;
3. the output, after which every scheduled request's ``num_computed_tokens``
   is advanced at once (rejected drafts are taken back in ``update_from_output``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference import events
from reference.arith import cdiv
from reference.config import Config
from reference.encoder_cache import EncoderCacheManager, encoder_budgets
from reference.encoder_inputs import free_encoder_inputs, try_schedule_encoder_inputs
from reference.kv_cache_coordinator import PerGroup
from reference.kv_cache_manager import KVCacheManager, block_ids
from reference.kv_cache_spec import MAMBA
from reference.kv_connector import KVConnector, last_token_computed_again, tokens_after_load
from reference.kv_events import KVEvent
from reference.lora import NO_ADAPTER_LIMIT, AdapterSlots
from reference.output import CachedRequestData, NewRequestData, SchedulerOutput
from reference.request import Request, RequestStatus, check_pooled, check_stop
from reference.request_queue import RequestQueue, make_queue, runs_before
from reference.stats import SchedulerStats, SpecDecodingStats
from reference.structured_output import GrammarBatch, grammar_batch


@dataclass
class StepPlan:
    """What the current step has granted so far."""

    token_budget: int
    new: list[Request] = field(default_factory=list)
    resumed: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)
    # Whether a running request scheduled this step was left mid-prefill by its last grant.
    running_prefill: bool = False
    preempted: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    new_block_ids: dict[str, list[list[int]]] = field(default_factory=dict)  # one list per group
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Where the pass over the running requests is.
    running_index: int = 0
    # The LoRA adapters of the step, once the running requests are scheduled.
    adapters: AdapterSlots | None = None
    # Multimodal: the encoder tokens left this step, and the items each request encodes.
    encoder_budget: int = 0
    encoder_inputs: dict[str, list[int]] = field(default_factory=dict)

    def grant(self, request: Request, num_tokens: int, block_ids: list[list[int]]) -> None:
        self.num_scheduled_tokens[request.request_id] = num_tokens
        self.new_block_ids[request.request_id] = block_ids
        self.token_budget -= num_tokens


class Scheduler:
    def __init__(self, config: Config, emit: events.Listener = events.ignore,
                 connector: KVConnector | None = None):
        """``connector``: a KV connector's scheduler side (reference.kv_connector); none
        by default."""
        self.config = config
        self.emit = emit
        self.connector = connector
        # Requests whose asynchronous load the worker reported done, not yet picked up.
        self.finished_recving: set[str] = set()
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.max_model_len,
                                 config.enable_prefix_caching,
                                 config.use_eagle and not self.hash_lookahead_tokens(), emit,
                                 config.groups, config.enable_kv_cache_events)
        if self.kv.has_window_groups:  # only their admission cap reads it
            self.kv.tokens_in_flight = self.tokens_in_flight()
        self.encoder_compute_budget, cache_size = self.encoder_sizes()
        self.encoder_cache = EncoderCacheManager(
            cache_size, items_taken_per_request=True,
            held_to_last_occurrence=True)
        self.requests: dict[str, Request] = {}
        # Whether any request so far came with a grammar: a step without one has no
        # structured-output part to work out.
        self.grammars_seen = False
        self.waiting = make_queue(config.policy)
        # From 0.18.0 (set_aside_requests_wait_apart): requests set aside, and new ones that
        # cannot run yet, wait in a queue of their own (vLLM's skipped_waiting).
        self.set_aside_queue = make_queue(config.policy)
        # From 0.31.0 (page_holders_wait_first) that queue holds the waiting requests that
        # hold pages, and the requests set aside (or arrived blocked) and not admitted since
        # are counted apart wherever they wait (vLLM's deferred_waiting).
        self.deferred: set[Request] = set()
        self.running: list[Request] = []
        # Requests whose prefill is under way: admitted and left mid-prefill, or loading
        # asynchronously (vLLM's _inflight_prefills; read from 0.23.0).
        self.inflight_prefills: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        # From 0.31.0: requests an image's length mismatch stopped, to finish with an error.
        self.encoder_mismatched: list[str] = []
        self.unfinished_at_step_start = 0  # num_unfinished() as the current step began
        self.threshold_this_step = 0  # long_prefill_threshold(), as the current step began
        # KV cache events, one batch per step that had any (vLLM's publisher).
        self.published_kv_events: list[list[KVEvent]] = []

    def encoder_sizes(self) -> tuple[int, int]:
        """The encoder's tokens per step and its cache's room, raised to the largest item."""
        c = self.config
        configured = c.max_num_batched_tokens
        return encoder_budgets(
            dict(c.max_tokens_by_modality),
            max_num_encoder_input_tokens=configured if c.encoder_compute_budget is None
            else c.encoder_compute_budget,
            encoder_cache_size=configured if c.encoder_cache_size is None else c.encoder_cache_size,
            max_num_batched_tokens=c.max_num_batched_tokens,
            disable_chunked_mm_input=c.disable_chunked_mm_input)

    # -- requests in and out ---------------------------------------------------------

    def add_request(self, request: Request) -> None:
        # Its prompt is hashed already; from 0.31.0 (later_hashing_sees_every_item) the
        # blocks its outputs complete are hashed with every item they touch.
        request.mm_later_hashing_sees_every_item = bool(request.encoder_inputs)
        if self.hash_lookahead_tokens() and request.hash_block_size is not None:
            request.hash_lookahead_tokens = self.hash_lookahead_tokens()
            request.block_hashes.clear()  # its prompt is hashed again, looking ahead
            request._hash_new_full_blocks()
        if request.status == RequestStatus.WAITING_FOR_FSM and self.waits_apart():
            self.set_aside_queue.add(request)  # it cannot run before its grammar is ready
        else:
            self.waiting.add(request)
        if request.status == RequestStatus.WAITING_FOR_FSM and self.holders_wait_first():
            self.deferred.add(request)
        self.requests[request.request_id] = request
        self.grammars_seen = self.grammars_seen or request.grammar is not None

    def hash_lookahead_tokens(self) -> int:
        """From 0.33.0 (eagle_hashes_cover_the_next_token), with an eagle drafter, prefix
        caching and no KV connector, a block's key also covers the token after it (the
        drafter's KV at the block's last position reads it), and the hit no longer drops
        its last block for the drafter."""
        c = self.config
        return int(c.use_eagle and c.num_speculative_tokens > 0 and c.enable_prefix_caching
                   and self.connector is None)

    def waits_apart(self) -> bool:
        return False

    def holders_wait_first(self) -> bool:
        return True

    @staticmethod
    def holds_pages(request: Request) -> bool:
        """A waiting request with pages: tokens computed, or an asynchronous load."""
        return (request.num_computed_tokens > 0
                or request.status == RequestStatus.WAITING_FOR_REMOTE_KVS)

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.set_aside_queue)

    def num_unfinished(self) -> int:
        return self.num_waiting() + len(self.running)

    def has_requests(self) -> bool:
        """Anything for a step to do: unfinished requests, or finished ones the worker
        has not been told of yet.  The engine does not step without them.  From 0.22.0
        (sending_requests_keep_the_engine_stepping), with a KV connector, also finished
        requests whose pages it is still sending: they stay known, in no queue."""
        if self.num_unfinished() > 0 or self.finished_req_ids:
            return True
        return (self.connector is not None
                and len(self.requests) > self.num_unfinished())

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """Abort from outside; unknown ids are ignored, and from 0.11.1 finished ones too."""
        found = [self.requests[r] for r in request_ids
                 if r in self.requests and not self.abort_passes_over(self.requests[r])]
        leaving_running = {r for r in found if r.status == RequestStatus.RUNNING}
        self.running = [r for r in self.running if r not in leaving_running]
        leaving_waiting = [r for r in found if r not in leaving_running]
        self.waiting.remove_all(leaving_waiting)
        self.set_aside_queue.remove_all(leaving_waiting)
        for request in found:
            loading = self.load_under_way(request)
            request.status = status
            self._free_request(request, keep_pages=loading)

    def abort_passes_over(self, request: Request) -> bool:
        """A finished request is still known while a KV connector sends its pages.  From
        0.11.1 an abort leaves it alone; 0.11.0 finishes it again: the connector is told
        once more, and the worker of it."""
        return request.is_finished

    def load_under_way(self, request: Request) -> bool:
        """Whether an abort finds the request's asynchronous load still running.  From
        0.16.0 (aborted_load_keeps_pages_until_done) its pages are then kept until the
        worker reports the load done, since the worker may still be writing into them; a
        load already reported done is forgotten and the pages go at once.  Up to 0.15.1
        they go at once in both cases."""
        if (request.status != RequestStatus.WAITING_FOR_REMOTE_KVS):
            return False
        if request.request_id in self.finished_recving:
            self.finished_recving.remove(request.request_id)
            return False
        return True

    def _free_request(self, request: Request, keep_pages: bool = False) -> None:
        """A finished request lets go of its encoder outputs and its pages -- unless a KV
        connector still sends the pages (or, ``keep_pages``, still loads into them): then
        they go when the transfer is reported done."""
        keep_pages = self.connector_keeps_pages(request) or keep_pages
        self.encoder_cache.free(request)
        self.inflight_prefills.pop(request.request_id, None)
        self.deferred.discard(request)
        self.finished_req_ids.add(request.request_id)
        if not keep_pages:
            self._free_pages(request)

    def _free_pages(self, request: Request) -> None:
        self.kv.free(request)
        del self.requests[request.request_id]

    def connector_keeps_pages(self, request: Request) -> bool:
        if self.connector is None:
            return False
        # From 0.20.0 the window is that of the computed tokens, not of all of them.
        self.kv.remove_skipped_blocks(
            request, self.kv.processed_tokens(request))
        (block_ids,) = self.kv.get_block_ids(request.request_id)
        # From 0.25.0 only the pages holding computed tokens: not the lookahead's.
        del block_ids[cdiv(request.num_computed_tokens, self.kv.block_size):]
        return self.connector.request_finished(request, block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()

    # -- one step --------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        plan = StepPlan(token_budget=self.config.max_num_batched_tokens,
                        encoder_budget=self.encoder_compute_budget)
        # Counted before the waiting loop takes requests out of their queues (a load
        # still under way is set aside and put back within the step).
        self.unfinished_at_step_start = self.num_unfinished()
        self.threshold_this_step = self.long_prefill_threshold()
        self._schedule_running(plan)
        plan.adapters = self.step_adapters(plan)
        if self.admits_waiting(plan):
            self._schedule_waiting(plan)
        self._check_limits(plan)
        output = self._make_output(plan)
        self._advance_computed_tokens(output)
        self._forget_reported_finished()
        return output

    def step_adapters(self, plan: StepPlan) -> AdapterSlots:
        """The step's LoRA slots once the running requests are scheduled; without
        ``max_loras`` there is no limit to keep."""
        if self.config.max_loras is None:
            return NO_ADAPTER_LIMIT
        return AdapterSlots(self.config.max_loras, self.adapter_holders(plan))

    def adapter_holders(self, plan: StepPlan) -> list[Request]:
        """The requests whose adapters hold the step's LoRA slots: the running requests
        scheduled in the step (quirks.LORA_SLOTS_OVERFILLED_AFTER_A_SKIP), from 0.33.0
        (lora_slots_held_by_every_running_request) every running request."""
        if self.config.max_loras is not None:
            return self.running
        return plan.running

    def publish_kv_events(self) -> None:
        """What the KV cache changed goes out as one batch, if anything did: at the end of
        ``schedule``, from 0.11.1 (kv_events_published_after_update) at the end of
        ``update_from_output``."""
        batch = self.kv.take_events()
        if batch:
            self.published_kv_events.append(batch)

    def admits_waiting(self, plan: StepPlan) -> bool:
        """A step that had to preempt admits no waiting request."""
        return not plan.preempted

    def cap_long_prefill(self, num_tokens: int) -> int:
        """A positive ``long_prefill_token_threshold`` caps the tokens of one request."""
        threshold = self.threshold_this_step
        return threshold if 0 < threshold < num_tokens else num_tokens

    def long_prefill_threshold(self) -> int:
        """The threshold in force in the step starting.  0.11.1 and 0.11.2
        (threshold_dropped_when_nothing_chunks) drop it at start-up when chunked prefill
        is off and prefix caching was not asked for."""
        c = self.config
        if not c.long_prefill_token_threshold:
            return 0
        if not c.enable_chunked_prefill:
            return 0  # from 0.34.0: a request that cannot be chunked is never capped
        if self.unfinished_at_step_start <= 1:
            # From 0.31.0 the cap holds a request back for the others' sake only, counted
            # as the step starts: a load under way counts while it is set aside.
            return 0
        return c.long_prefill_token_threshold

    def running_tokens(self, request: Request, budget: int) -> int:
        """Tokens a running request computes now: threshold, budget, then model length.
        Output placeholders (async scheduling) count as tokens to compute."""
        num_new = self.cap_long_prefill(request.num_tokens_with_spec
                                        + request.num_output_placeholders
                                        - request.num_computed_tokens)
        return self.cap_model_len(request, min(num_new, budget))

    def cap_model_len(self, request: Request, num_tokens: int) -> int:
        """The last position computed must stay inside the model (drafts can reach past it).

        0.11.1 and 0.11.2 (running_tokens_capped_by_max_tokens): also inside the
        request's last output, prompt + max_tokens.
        """
        limit = self.config.max_model_len
        return min(num_tokens, limit - 1 - request.num_computed_tokens)

    def _schedule_running(self, plan: StepPlan) -> None:
        while plan.running_index < len(self.running) and plan.token_budget > 0:
            request = self.running[plan.running_index]
            if self.placeholders_reach_max_tokens(request):
                plan.running_index += 1
                continue
            num_new = self.running_tokens(request, plan.token_budget)
            encode, num_new, encoder_budget = self.encoder_grant(
                request, request.num_computed_tokens, num_new, plan)
            if num_new == 0:
                plan.running_index += 1  # skip it, but let the requests behind it run
                continue
            new_blocks = self._allocate_or_preempt(request, num_new, plan)
            if new_blocks is None:
                if self.goes_on_after_self_preemption():
                    continue  # it left the running list: the index names the next one
                break  # it preempted itself: nothing lower is left to preempt
            plan.running.append(request)
            plan.running_prefill |= request.left_mid_prefill
            plan.grant(request, num_new, block_ids(new_blocks))
            plan.running_index += 1
            if request.spec_token_ids:
                self._schedule_drafts(request, num_new, plan)
            self._encode(request, encode, encoder_budget, plan)

    def goes_on_after_self_preemption(self) -> bool:
        """From 0.33.0 (priority_self_preemption_goes_on), under priority, a request that
        preempted itself was the least urgent running one: the requests after it are more
        urgent and may fit in the pages it gave back, so the pass goes on."""
        return (self.config.policy == "priority")

    def placeholders_reach_max_tokens(self, request: Request) -> bool:
        """From 0.12.0 (async_skips_requests_at_max_tokens): a request whose output
        placeholders already take it to max_tokens is passed over."""
        return (request.num_output_placeholders > 0
                and request.num_computed_tokens + 2 - request.num_output_placeholders
                >= len(request.prompt_token_ids) + request.max_tokens)

    def encoder_grant(self, request: Request, num_computed: int, num_new: int,
                      plan: StepPlan) -> tuple[list[int], int, int]:
        """The items whose encoder runs now, the tokens left once a placeholder that
        cannot be encoded now cuts the grant, and the encoder budget left after them."""
        if not request.encoder_inputs:
            return [], num_new, plan.encoder_budget
        return try_schedule_encoder_inputs(
            request, num_computed, num_new, plan.encoder_budget, self.encoder_cache,
            disable_chunked_mm_input=self.config.disable_chunked_mm_input,
            lookahead=self.drafter_reads_ahead(),
            encode_ahead=True,
            whole_item_lookahead=self.drafter_reads_ahead(),
            cut_at_item=True,
            whole_item_first=True,
            whole_item_from_inside=True,
            rejected=self.encoder_mismatched)

    def drafter_reads_ahead(self) -> int:
        """Placeholders an eagle drafter reads past the granted range: from 0.12.0 one,
        since the drafter runs one position ahead of the target model."""
        return int(self.config.use_eagle)

    def _encode(self, request: Request, encode: list[int], encoder_budget: int,
                plan: StepPlan) -> None:
        """A scheduled request's items take their room in the encoder cache."""
        if encode:
            plan.encoder_inputs[request.request_id] = encode
            for i in encode:
                self.encoder_cache.allocate(request, i)
            plan.encoder_budget = encoder_budget

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: StepPlan):
        """Pages for a running request, preempting others until they fit."""
        while True:
            new_blocks = self.kv.allocate_slots(
                request, num_new, num_lookahead_tokens=self.config.num_lookahead_tokens)
            if new_blocks is not None:
                return new_blocks
            victim = self._pick_victim(plan)
            self._preempt(victim, plan)
            if victim is request:
                return None

    def _pick_victim(self, plan: StepPlan) -> Request:
        """Take the policy's victim out of the running list (and of this step's list).

        Under priority the victim may already be scheduled in this step; see
        quirks.PRIORITY_VICTIM_KEEPS_ITS_GRANT for what 0.11.0 does then.
        """
        victim = self.priority_victim() if self.config.policy == "priority" else self.fcfs_victim()
        victim_index = self.running.index(victim)
        self.running.remove(victim)
        if victim in plan.running:
            plan.running.remove(victim)
            self._revoke_grant(victim, plan)
        elif victim_index < plan.running_index:
            # From 0.28.0 a victim passed over earlier in the step (no tokens for it) also
            # steps the pass back, so the request after the current one is not skipped.
            plan.running_index -= 1
        return victim

    def _revoke_grant(self, victim: Request, plan: StepPlan) -> None:
        """0.11.1 and later: a victim scheduled earlier in this step leaves the step.

        Its budget comes back, its pages and drafts are not handed out, and the
        pass steps back one place: the victim stood before the current request.
        """
        plan.token_budget += plan.num_scheduled_tokens.pop(victim.request_id)
        plan.new_block_ids.pop(victim.request_id)
        plan.spec_tokens.pop(victim.request_id, None)
        plan.running_index -= 1

    def fcfs_victim(self) -> Request:
        """fcfs preempts the request that joined the running list last."""
        return self.running[-1]

    def priority_victim(self) -> Request:
        """priority preempts the largest (priority, arrival_time): the least urgent, newest."""
        return max(self.running, key=lambda r: (r.priority, r.arrival_time))

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
        """Recompute later: drop its pages, encoder outputs and progress, queue it at the head."""
        self.kv.free(victim)
        self.encoder_cache.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.inflight_prefills.pop(victim.request_id, None)
        self.waiting.prepend(victim)
        plan.preempted.append(victim)
        self.emit(events.Preempted(victim.request_id))

    def _schedule_drafts(self, request: Request, num_new: int, plan: StepPlan) -> None:
        num_drafts = self.num_scheduled_drafts(request, num_new)
        if num_drafts > 0:
            del request.spec_token_ids[num_drafts:]
            plan.spec_tokens[request.request_id] = request.spec_token_ids

    def num_scheduled_drafts(self, request: Request, num_new: int) -> int:
        """The drafts inside the granted tokens; those past them are cut off."""
        return num_new + request.num_computed_tokens - request.num_tokens

    def _schedule_waiting(self, plan: StepPlan) -> None:
        set_aside = make_queue(self.config.policy)
        while self.num_waiting() and plan.token_budget > 0:
            if not self.has_free_seat():
                break
            queue = self.next_waiting_queue()
            request = queue.peek()
            if (self.waits_for_remote_kv(request) or self.waits_for_grammar(request)
                    or plan.adapters.turns_away(request)):
                self.set_aside(set_aside, queue.pop())
                continue
            looked_up = request.num_computed_tokens == 0
            hit, num_hit, num_computed = self._lookup_prefix(request)
            external = self.external_hit(request, num_hit)
            if external is None:  # the connector cannot tell yet
                self.set_aside(set_aside, queue.pop())
                continue
            num_external, load_async = external
            num_computed += num_external
            encode, encoder_budget = [], plan.encoder_budget
            padding: int | None = 0
            num_new: int | None
            if load_async:
                num_new = 0  # pages for the loaded tokens only; nothing is computed now
            else:
                padding = self.decode_padding(request, num_computed, plan)
                if padding is None:
                    break  # padded, it would not fit: the waiting part ends
                num_new = self.waiting_grant(request, num_computed, plan, padding)
                if num_new is None:
                    break  # 0.12.0 and later: the requests behind it wait too
                    self.set_aside(set_aside, queue.pop())
                    continue
                assert num_new > 0
                encode, num_new, encoder_budget = self.encoder_grant(request, num_computed,
                                                                     num_new, plan)
                if num_new and self.unchunked_prompt_cut(request, num_computed, num_new):
                    self.encoder_cache.free(request)  # the hits its lookup took, too
                    encode, num_new = [], 0
                if num_new == 0:
                    self.set_aside(set_aside, queue.pop())  # from 0.33.0
                    continue
                    break  # its next item cannot be encoded now: the waiting part ends
            if not self.fits_whole_sequence(request, hit, num_computed):
                self.not_admitted(request)
                break
            new_blocks = self.kv.allocate_slots(request, num_new + num_external, num_hit, hit,
                                                self.admission_lookahead(request, load_async),
                                                delay_caching=load_async,
                                                num_external_tokens=num_external,
                                                reserved_blocks=self.reserved_for_prefills()
                                                if load_async else 0)
            if new_blocks is None:
                self.not_admitted(request)
                break  # a waiting request never preempts: it waits for pages
            self.tell_connector_pages(request, hit, new_blocks, num_external)
            if looked_up:
                self.kv.lookup_admitted(request, num_hit)
            if load_async:
                request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                request.num_computed_tokens = num_computed
                self.inflight_prefills[request.request_id] = request
                self.set_aside(set_aside, queue.pop())
                continue
            self._admit(queue.pop(), num_new, num_computed, plan)
            if num_computed + num_new < request.num_tokens:
                self.inflight_prefills[request.request_id] = request
            if padding:
                self.check_padded_grant(num_new, padding)
                plan.spec_tokens[request.request_id] = [-1] * padding
            self._encode(request, encode, encoder_budget, plan)
        if len(set_aside):
            self.put_back(set_aside)

    def tokens_in_flight(self) -> int:
        """Tokens scheduled and not yet applied, at most, as the whole-sequence admission
        test of a window group counts them: a step's budget; from 0.26.0
        (window_cap_counts_batches_in_flight) the budget of every batch in flight: two
        under async scheduling (on one pipeline stage), else one per pipeline stage."""
        c = self.config
        batches = 2 if c.async_scheduling and c.pipeline_parallel_size <= 1 \
            else c.pipeline_parallel_size
        return batches * c.max_num_batched_tokens

    def reserved_for_prefills(self) -> int:
        """Free pages an asynchronous load may not take.  From 0.23.0
        (async_load_leaves_room_for_prefills) the pages the prefills under way still need
        to hold their whole sequence (capped at max_model_len), a load being admitted only
        from the rest; up to 0.22.1 none.  With drafting on, from 0.31.0
        (async_load_reserves_a_draft_step) each of them, and the load itself, also keeps
        the pages of one decode step with drafts (:meth:`draft_step_pages`); from 0.32.0
        (draft_step_counted_in_each_group) a prefill's share is counted with its sequence,
        as the pages of its whole sequence plus that step's tokens."""
        c = self.config
        step = self.draft_step_pages()
        extra = self.draft_step_tokens()
        return step + sum(self.kv.pages_still_needed(r, extra)
                          for r in self.inflight_prefills.values())

    def draft_step_tokens(self) -> int:
        """Slots one decode step with drafts writes: the sampled token, the drafts, and an
        eagle drafter's lookahead; none without drafting."""
        c = self.config
        return 1 + c.num_speculative_tokens + c.num_lookahead_tokens \
            if c.num_speculative_tokens else 0

    def draft_step_pages(self) -> int:
        """Pages an asynchronous load keeps free for one decode step with drafts: from
        0.31.0 (async_load_reserves_a_draft_step) that step's slots in pages of
        block_size; from 0.32.0 (draft_step_counted_in_each_group) in each group's pages,
        added up over the groups but Mamba ones (their state pages count drafts already)."""
        c = self.config
        if not c.num_speculative_tokens:
            return 0
        tokens = self.draft_step_tokens()
        return sum(cdiv(tokens, g.block_size) for g in c.groups if g.kind != MAMBA)

    def put_back(self, set_aside: RequestQueue) -> None:
        """The requests set aside in the step go back to the head of their queue: up to
        0.17.1 and from 0.31.0 the waiting queue, 0.18.0 to 0.30.0 the set-aside queue.
        From 0.31.0 (page_holders_wait_first) those holding pages go to the head of the
        page holders' queue instead."""
        reverse = True
        if not self.holders_wait_first():
            (self.set_aside_queue if self.waits_apart() else self.waiting).prepend_all(
                set_aside, reverse=reverse)
            return
        holders, others = make_queue(self.config.policy), make_queue(self.config.policy)
        for request in set_aside:  # the set-aside order is kept within each
            (holders if self.holds_pages(request) else others).add(request)
        self.set_aside_queue.prepend_all(holders, reverse=reverse)
        self.waiting.prepend_all(others, reverse=reverse)

    def unchunked_prompt_cut(self, request: Request, num_computed: int, num_new: int) -> bool:
        """From 0.34.0 (unchunked_mm_prompt_not_split), with chunked prefill off, a request
        whose grant an item that cannot be encoded now cut short of its whole sequence
        gets nothing this step, rather than a partial prefill."""
        return (bool(request.encoder_inputs) and not self.config.enable_chunked_prefill
                and num_new < request.num_tokens - num_computed)

    def not_admitted(self, request: Request) -> None:
        """A waiting request turned away for want of pages after its items were looked up
        in the encoder cache.  The lookup made it a holder of the cached items it found, so
        they cannot be evicted; up to 0.13.0 it stays one until it is admitted or finishes.
        From 0.14.0 (failed_admission_lets_go_of_encoder_inputs) it lets go of them at once,
        as a finished request does."""
        if request.encoder_inputs:
            self.encoder_cache.free(request)

    def next_waiting_queue(self) -> RequestQueue:
        """Where the next waiting request comes from.  Up to 0.17.1 there is one queue (the
        set-aside requests went back to its head).  From 0.18.0 the set-aside queue comes
        first under fcfs; under priority the better of the two heads wins.  From 0.31.0
        (page_holders_wait_first) the page holders' queue comes first under both policies."""
        if not len(self.set_aside_queue):
            return self.waiting
        if self.holders_wait_first():
            return self.set_aside_queue
        if not len(self.waiting) or self.config.policy == "fcfs":
            return self.set_aside_queue
        return self.waiting if runs_before(self.waiting.peek(), self.set_aside_queue.peek()) \
            else self.set_aside_queue


    # -- a KV connector (reference.kv_connector) -------------------------------------------

    def waits_for_remote_kv(self, request: Request) -> bool:
        """A request whose load is not reported done is set aside; once it is, the request
        takes the loaded tokens as computed and is considered like any other.  It waits
        again as WAITING -- from 0.14.0 (loaded_preempted_request_resumes) as PREEMPTED
        when it was preempted before, so it is admitted as a resumed request and shows
        that status while it cannot be admitted."""
        if request.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            return False
        if request.request_id not in self.finished_recving:
            return True
        self._take_loaded_tokens(request)
        request.status = (RequestStatus.PREEMPTED if request.num_preemptions
                          else RequestStatus.WAITING)
        return False

    def _take_loaded_tokens(self, request: Request) -> None:
        """Up to 0.17.1 the loaded tokens are every token the request's pages cover; from
        0.18.0 (async_load_counts_tokens_at_once) the count set when the load started,
        whose pages are cached before its last token is taken back."""
        self.kv.cache_blocks(request, request.num_computed_tokens)
        request.num_computed_tokens = last_token_computed_again(request.num_computed_tokens,
                                                                request.num_tokens)
        self.finished_recving.remove(request.request_id)

    def external_hit(self, request: Request, num_hit: int) -> tuple[int, bool] | None:
        """(tokens loadable from outside past the local hit, whether the load is async), or
        None while the connector cannot tell.  Only a request with nothing computed asks."""
        if self.connector is None or request.num_computed_tokens > 0:
            return 0, False
        num_external, load_async = self.connector.get_num_new_matched_tokens(request, num_hit)
        if request.wants_prompt_logprobs:
            return 0, False  # from 0.31.0 it reads no prefix, not even one from outside
        if num_external is None:
            return None
        assert num_external > 0 or not load_async
        return num_external, load_async

    def tell_connector_pages(self, request: Request, hit, new_blocks, num_external: int) -> None:
        """The connector learns the request's pages (hit pages first) right after they are
        given, and how many of its tokens come from outside.  From 0.16.0
        (connector_told_whole_table) it is told the request's whole table, so a request
        whose load is done hears of its loaded pages again when it is admitted."""
        if self.connector is None:
            return
        pages = self.kv.get_block_ids(request.request_id)[0]
        self.connector.update_state_after_alloc(request, pages, num_external)

    def take_transfers(self, finished_recving, finished_sending) -> None:
        """The worker's report: loads done (the requests may run from the next step) and
        sends done (the pages a finished request kept are freed now, in the report's order;
        an id the scheduler no longer knows is ignored).

        From 0.16.0 (aborted_load_keeps_pages_until_done) a load done for a request
        aborted while it ran frees the pages the request kept for it, loads before sends.
        A request aborted while loading whose connector also keeps its pages to send them
        gets two reports: the first frees it, and the second names a request the scheduler
        no longer knows, which vLLM asserts against (quirks.ABORTED_LOAD_REPORTED_TWICE)."""
        frees_loads = True
        for req_id in finished_recving:
            request = self.requests.get(req_id)
            if frees_loads and request is None:
                raise AssertionError(f"a transfer report for {req_id}, a request no longer known")
            if frees_loads and request.is_finished:
                self._free_pages(request)
            else:
                self.finished_recving.add(req_id)
        for req_id in finished_sending:
            request = self.requests.get(req_id)
            if frees_loads and request is None:
                raise AssertionError(f"a transfer report for {req_id}, a request no longer known")
            if request is not None:
                self._free_pages(request)

    def waits_for_grammar(self, request: Request) -> bool:
        """A request in WAITING_FOR_FSM is set aside until its grammar is ready; the
        status changes only when the scheduler reaches it with the grammar ready."""
        if request.status != RequestStatus.WAITING_FOR_FSM:
            return False
        if request.grammar.ready:
            request.status = RequestStatus.WAITING
            return False
        return True

    def fits_whole_sequence(self, request: Request, hit, num_computed: int) -> bool:
        """From 0.19.0 (admission_reserves_whole_sequence) a waiting request is admitted
        only when the free pages would hold all its tokens, not only the step's; when they
        would not, the waiting part of the step ends, as when allocation fails."""
        return (self.kv.can_fit_whole_sequence(request, hit, num_computed))

    def has_free_seat(self) -> bool:
        """At most ``max_num_seqs`` requests run at once."""
        return len(self.running) < self.config.max_num_seqs

    def _lookup_prefix(self, request: Request) -> tuple[PerGroup | list, int, int]:
        """(hit pages, hit tokens, tokens computed before the step) of a waiting request.

        Only a request with no computed tokens looks in the prefix cache: the
        quirk PRIORITY_VICTIM_KEEPS_ITS_GRANT leaves a waiting request with
        computed tokens (and no pages), which keeps its count instead.
        """
        if request.num_computed_tokens == 0:
            hit, num_hit = self.kv.get_computed_blocks(request)
            return hit, num_hit, num_hit
        return [], 0, request.num_computed_tokens

    def waiting_grant(self, request: Request, num_computed: int, plan: StepPlan,
                      padding: int = 0) -> int | None:
        """Tokens a waiting request computes now, or None when it is set aside: the
        long-prefill threshold first (on the tokens and their ``padding``), then (chunked
        prefill off) the whole-prompt test against the remaining budget, then the budget."""
        num_new = self.waiting_tokens(request, num_computed, padding)
        if self.sets_aside(num_new, plan):
            return None
        return min(num_new, plan.token_budget)

    def waiting_tokens(self, request: Request, num_computed: int, padding: int = 0) -> int:
        """Every token not yet computed, outputs included (a resumed request recomputes
        them), and the padding, cut by the long-prefill threshold; the budget is applied
        later."""
        return self.cap_long_prefill(request.num_tokens - num_computed + padding)

    def decode_padding(self, request: Request, num_computed: int, plan: StepPlan) -> int | None:
        """Placeholder drafts a waiting request is padded with (0: none), or None when,
        padded, it would not fit and the waiting part of the step ends.

        From 0.25.0 (new_decode_padded_with_drafts), with drafting on: a waiting request
        with one token left to compute, met while the step's running requests all decode
        (at least one is scheduled, and none was left mid-prefill by its last grant),
        computes as many positions as a drafting request does, one plus
        num_speculative_tokens: the extra ones are drafts of -1, which the model rejects.
        If those positions exceed the budget or max_model_len, the waiting part ends.
        From 0.29.0 (decode_padding_leaves_room_to_sample) a request is padded only if
        max_model_len leaves room for the token sampled after the padding too; otherwise
        it runs its one token unpadded, and only the budget can end the waiting part."""
        width = 1 + self.config.num_speculative_tokens
        if (width == 1
                or request.num_tokens - num_computed != 1
                or not plan.running and not self.pads_without_running(num_computed)
                or plan.running_prefill):
            return 0
        if num_computed + width + 1 > self.config.max_model_len:
            return 0
        return None if width > plan.token_budget else width - 1

    def check_padded_grant(self, num_new: int, padding: int) -> None:
        """A padded grant cut afterwards (by the long-prefill threshold, by an encoder
        input) keeps its ``padding`` placeholder drafts; from 0.29.0
        (decode_padding_leaves_room_to_sample) vLLM asserts that it was not cut, and the
        engine raises AssertionError."""
        if num_new != 1 + padding:
            raise AssertionError(f"a padded grant of {num_new} tokens, not {1 + padding}")

    def pads_without_running(self, num_computed: int) -> bool:
        """From 0.30.0 (padding_without_running_requests) a request with tokens computed
        already (a prefix hit, a load, a resumption) is padded in a step that scheduled no
        running request too."""
        return num_computed > 0

    def sets_aside(self, num_new: int, plan: StepPlan) -> bool:
        """With chunked prefill off, a request that does not fit whole waits for a later
        step, and the requests behind it get their turn."""
        return not self.config.enable_chunked_prefill and num_new > plan.token_budget

    def set_aside(self, set_aside: RequestQueue, request: Request) -> None:
        """A request set aside goes to the head of the set-aside queue, so under fcfs
        several set aside in one step come back reversed
        (quirks.SKIPPED_WAITING_REQUESTS_REVERSED) -- until 0.14.0, whose queue reverses
        them again as it puts them back (set_aside_order_kept)."""
        set_aside.prepend(request)
        if self.holders_wait_first():
            self.deferred.add(request)
        self.emit(events.SetAside(request.request_id))

    def admission_lookahead(self, request: Request, load_async: bool = False) -> int:
        """Eagle's lookahead slots are reserved for a resumed request, not a new one; from
        0.23.0 (admission_reserves_lookahead) for every admission but an asynchronous load."""
        if not self.config.num_lookahead_tokens:
            return 0
        return 0 if load_async else self.config.num_lookahead_tokens

    def _admit(self, request: Request, num_new: int, num_computed: int, plan: StepPlan) -> None:
        self.running.append(request)
        self.deferred.discard(request)
        (plan.new if request.status == RequestStatus.WAITING else plan.resumed).append(request)
        plan.adapters.take(request)
        plan.grant(request, num_new, self.kv.get_block_ids(request.request_id))
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed

    def _check_limits(self, plan: StepPlan) -> None:
        assert sum(plan.num_scheduled_tokens.values()) <= self.config.max_num_batched_tokens
        assert plan.token_budget >= 0
        assert len(self.running) <= self.config.max_num_seqs
        assert len(plan.new) + len(plan.resumed) + len(plan.running) <= len(self.running)

    def _make_output(self, plan: StepPlan) -> SchedulerOutput:
        new = [NewRequestData(r.request_id, plan.new_block_ids[r.request_id], r.num_computed_tokens)
               for r in plan.new]
        cached = [CachedRequestData(r.request_id, resumed,
                                    none_if_empty(plan.new_block_ids[r.request_id]),
                                    r.num_computed_tokens)
                  for requests, resumed in ((plan.running, False), (plan.resumed, True))
                  for r in requests]
        return SchedulerOutput(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=plan.num_scheduled_tokens,  # the plan ends with the step
            scheduled_spec_decode_tokens={k: list(v) for k, v in plan.spec_tokens.items()},
            finished_req_ids=self.finished_req_ids,
            grammar=self.grammar_batch(plan),
            scheduled_encoder_inputs={k: list(v) for k, v in plan.encoder_inputs.items()},
            free_encoder_mm_hashes=self.encoder_cache.get_freed_mm_hashes(
                skip_cached_again=bool(self.encoder_cache.freed)),
        )

    def grammar_batch(self, plan: StepPlan):
        """The structured-output part of the step.  0.11.0 orders it as the worker's
        batch; from 0.11.1 (grammar_rows_in_grant_order) in the order tokens were granted."""
        # Every request of the batch has a grant (a priority victim of 0.11.0 keeps its
        # grant after leaving the batch): with none constrained, both orders give nothing.
        if not self.grammars_seen:
            return GrammarBatch()
        granted = [self.requests[rid] for rid in plan.num_scheduled_tokens]
        if not any(r.grammar is not None for r in granted):
            return GrammarBatch()
        granted = [r for r in granted if not self.is_prefill_chunk(r, plan)]
        return grammar_batch(granted, plan.spec_tokens, index_among_constrained=True,
                             invalid_drafts=self.keeps_first_invalid_draft(),
                             last_row_after_placeholder=False)

    def is_prefill_chunk(self, request: Request, plan: StepPlan) -> bool:
        """The step leaves part of the request's known tokens uncomputed: it samples nothing
        (from 0.17.0 such a request gets no bitmask row, grammar_rows_skip_prefill_chunks)."""
        computed = request.num_computed_tokens + plan.num_scheduled_tokens[request.request_id]
        return computed < request.num_tokens + request.num_output_placeholders

    def keeps_first_invalid_draft(self) -> bool:
        """From 0.34.0 (grammar_keeps_first_invalid_draft) a request's drafts are cut after
        the first one its grammar rejects, not before it; the bitmask leaves the rows
        after that draft unfilled, so the model rejects it."""
        return True

    def _advance_computed_tokens(self, output: SchedulerOutput) -> None:
        """Count the scheduled tokens as computed now, so the next step can go on, and let
        go of the encoder outputs whose placeholders are now computed."""
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            request.num_computed_tokens += num_tokens
            request.num_in_flight_tokens += num_tokens
            request.left_mid_prefill = (request.num_computed_tokens
                                        < request.num_tokens + request.num_output_placeholders)
            if not request.left_mid_prefill:
                self.inflight_prefills.pop(req_id, None)

    def _free_computed_encoder_inputs(self, request: Request) -> None:
        """Let go of the encoder outputs whose placeholders the request has computed past:
        right after scheduling up to 0.19.1, once the step's outputs are in from 0.20.0
        (encoder_frees_wait_for_outputs; with async scheduling, after the next step is
        scheduled).  From 0.24.0 (placeholder_tokens_hold_encoder_outputs) tokens whose
        sample is not in yet do not count as computed."""
        computed = request.num_computed_tokens
        computed -= request.num_output_placeholders
        free_encoder_inputs(request, computed, self.encoder_cache,
                            drafter_lookahead=self.encoder_free_lookahead())

    def encoder_free_lookahead(self) -> int:
        """Tokens past an item's end its encoder output stays held for: from 0.24.0 until
        0.33.0 (encoder_outputs_held_for_the_drafter) an eagle drafter's read-ahead, one."""
        return int(False)

    def _forget_reported_finished(self) -> None:
        """Finished ids are handed to the worker once, in the next step's output."""
        self.finished_req_ids = set()

    # -- after the model ran -----------------------------------------------------------

    def update_from_output(self, output: SchedulerOutput, sampled: dict[str, list[int]],
                           finished_recving=(), finished_sending=()) -> SchedulerStats | None:
        """Take the sampled tokens: undo rejected drafts, append outputs, stop requests;
        then report the step's stats (when logged).

        ``sampled`` holds the requests the model answered for: the tokens sampled, or
        for a pooling request its pooled output (no token).  A partial prefill is absent.
        ``finished_recving`` and ``finished_sending``: the worker's KV transfer report.
        """
        stopped_running, stopped_waiting = [], []
        spec_decoding = None
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None:
                continue
            request.num_in_flight_tokens -= num_tokens
            tokens = list(sampled.get(req_id, []))
            drafts = output.scheduled_spec_decode_tokens.get(req_id)
            if drafts:
                self._take_back_rejected(request, drafts, tokens)
                spec_decoding = spec_decoding or SpecDecodingStats.new(
                    self.config.num_speculative_tokens)
                spec_decoding.observe_draft(len(drafts), num_accepted(tokens))
            if (request.encoder_inputs and not request.is_finished):
                self._free_computed_encoder_inputs(request)
            status_before = request.status
            had_placeholders = request.num_output_placeholders > 0
            kept, stopped = self._append_outputs(request, tokens) if tokens else ([], False)
            if tokens and status_before == RequestStatus.RUNNING:
                self._after_outputs(request, tokens, kept, had_placeholders)
            if request.pooling and req_id in sampled:
                stopped = check_pooled(request)
            if stopped:
                self._free_request(request)
                (stopped_running if status_before == RequestStatus.RUNNING
                 else stopped_waiting).append(request)
            if kept and request.grammar is not None:
                request.grammar.accept(kept)
        if stopped_running:
            gone = set(stopped_running)
            self.running = [r for r in self.running if r not in gone]
        if stopped_waiting:
            self.waiting.remove_all(stopped_waiting)
            self.set_aside_queue.remove_all(stopped_waiting)
        self.fail_mismatched_requests()
        if self.connector is not None:
            self.take_transfers(finished_recving, finished_sending)
        if self.config.enable_kv_cache_events:
            self.publish_kv_events()
        return self.make_stats(spec_decoding)

    def fail_mismatched_requests(self) -> None:
        """From 0.31.0 (encoder_length_mismatch_fails_request): the requests whose image
        came with another length than the encoder output cached for its hash are
        finished with an error once the step's outputs are in, in the order they arrived.

        vLLM finishes them in the order of a set of their ids, which follows the string
        hash of the process; the harness has it finish them in arrival order
        (``harness/engines/vllm_adapter.finish_in_arrival_order``)."""
        if not self.encoder_mismatched:
            return
        mismatched, self.encoder_mismatched[:] = set(self.encoder_mismatched), []
        failed = [rid for rid in self.requests if rid in mismatched]
        self.finish_requests(failed, RequestStatus.FINISHED_ERROR)

    def make_stats(self, spec_decoding: SpecDecodingStats | None) -> SchedulerStats | None:
        """The report that ends every update when stats are logged: the queues' lengths
        after it, the pool's usage, the prefix-cache lookups since the last report and this
        step's drafts."""
        if not self.config.log_stats:
            return None
        if self.holders_wait_first():
            return SchedulerStats(len(self.running), self.num_waiting() - len(self.deferred),
                                  self.kv.usage(), self.kv.take_prefix_cache_stats(),
                                  spec_decoding, num_set_aside=len(self.deferred))
        return SchedulerStats(len(self.running), len(self.waiting), self.kv.usage(),
                              self.kv.take_prefix_cache_stats(), spec_decoding,
                              num_set_aside=len(self.set_aside_queue))

    def _take_back_rejected(self, request: Request, drafts: list[int], tokens: list[int]) -> None:
        """Rejected drafts leave num_computed_tokens -- also for a request preempted in
        this step, whose count restarted (quirks.REJECTED_DRAFTS_ALWAYS_SUBTRACTED)."""
        request.num_computed_tokens -= self.num_rejected(drafts, tokens)

    def num_rejected(self, drafts: list[int], tokens: list[int]) -> int:
        """Drafts the model did not accept: it returns the accepted ones plus one of its own.

        Their KV was written and counted as computed; it is taken back.
        """
        return len(drafts) - num_accepted(tokens)

    def _after_outputs(self, request: Request, tokens: list[int], kept: list[int],
                       had_placeholders: bool) -> None:
        """From 0.33.0 (outputs_update_the_cache_at_once) a running request's computed
        count leaves out the tokens a stop dropped, and a request with drafts configured
        (or output placeholders) gets the pages its computed tokens fill cached now, before
        a stop frees them, not at its next allocation."""
        request.num_computed_tokens -= len(tokens) - len(kept)
        if had_placeholders or self.config.num_speculative_tokens > 0:
            self.kv.cache_blocks(request, request.num_computed_tokens
                                 - request.num_output_placeholders)

    def _append_outputs(self, request: Request, tokens: list[int]) -> tuple[list[int], bool]:
        """Append tokens one by one; a stop drops the tokens after it.  Returns the
        tokens kept and whether the request stopped."""
        for i, token in enumerate(tokens):
            request.append_output_token(token)
            if check_stop(request, self.config.max_model_len,
                          True):
                return tokens[:i + 1], True
        return tokens, False

    def update_draft_token_ids(self, drafts: dict[str, list[int]]) -> None:
        for req_id, tokens in drafts.items():
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue
            if tokens and request.grammar is not None:
                valid = request.grammar.validate(list(tokens))
                # From 0.34.0 the first draft the grammar rejects stays, its row unfilled.
                tokens = tokens[:len(valid) + 1] if self.keeps_first_invalid_draft() else valid
            request.spec_token_ids = list(tokens)


def num_accepted(tokens: list[int]) -> int:
    """Drafts the model accepted: all the tokens it returned but its own last one."""
    return len(tokens) - 1


def none_if_empty(block_ids: list[list[int]]) -> list[list[int]] | None:
    """A running request that got no new page in any group is handed None."""
    return block_ids if any(block_ids) else None
