"""Design differences: the ways simulators of vLLM's scheduler depart from it by design.

A mutant (:mod:`harness.checks.mutants`) breaks one of vLLM's rules, as a slip would.
A simulator departs by design: it runs prefills and decodes in separate steps, counts
``max_num_seqs`` per batch, keeps no null page.  Each entry here is such a design, put in
place of vLLM's on the reference (the same patch mechanism as a mutant, active only
inside ``design.patch()``), so that the conformance profile can name it: a simulator's
divergence that the reference with these designs reproduces is explained, not left
"unexplained".  ``rule`` names the vLLM rule the design replaces, ``mirrors`` the vLLM
0.11.0 module that holds it; :data:`USED_BY` names the simulators known to make the choice.

tests/test_designs.py holds each entry to a bundled stream that it alone explains: no
mutant and no other design gives the trace it gives.
"""

from __future__ import annotations

import contextlib

from harness.formats.compiled import require_interpreted
from harness.formats.mutant import BLOCK_POOL, KV_CACHE_MANAGER, SCHEDULER, Mutant
from reference.block_pool import BlockPool
from reference.config import Config
from reference.kv_cache_manager import KVCacheManager
from reference.lora import AdapterSlots
from reference.request import RequestStatus
from reference.scheduler import Scheduler, StepPlan

#: The design differences, in catalogue order.
DESIGNS: list[Mutant] = []
#: The simulators known to make each choice.
USED_BY: dict[str, str] = {}


class Wraps:
    """A replacement made when the patch is entered, around what stands there then: two
    designs that wrap the same method both apply when combined."""

    def __init__(self, wrap):
        self.wrap = wrap  # inner -> new


def design(name: str, rule: str, mirrors: str, simulators: str, *replacements):
    """Register a design difference: ``replacements`` are ``(owner, attribute, new)``, where
    ``new`` may be a :class:`Wraps` of what the attribute holds when the patch begins."""
    def patch() -> contextlib.AbstractContextManager:
        require_interpreted(f"the design {name}")
        stack = contextlib.ExitStack()
        from unittest import mock
        for owner, attr, new in replacements:
            if isinstance(new, Wraps):
                new = new.wrap(getattr(owner, attr))
            stack.enter_context(mock.patch.object(owner, attr, new))
        return stack
    DESIGNS.append(Mutant(name, rule, mirrors, patch, side="design"))
    USED_BY[name] = simulators


def find(name: str) -> Mutant | None:
    return next((d for d in DESIGNS if d.name == name), None)


# -- prefill steps apart --------------------------------------------------------------------

def _waiting_before_running(inner):
    """The waiting requests are admitted first, in the running pass's place; the running
    requests run only in a step that admits none."""
    def schedule_running(self, plan: StepPlan) -> None:
        plan.adapters = AdapterSlots(self.config.max_loras, [])
        self._schedule_waiting(plan)  # looked up: another design may wrap it
        plan.waiting_done = True
        if not (plan.new or plan.resumed):
            inner(self, plan)
    return schedule_running


def _admits_waiting_once(inner):
    return lambda self, plan: not getattr(plan, "waiting_done", False) and inner(self, plan)


design("prefill_steps_apart",
       "one step schedules the running requests first, then admits waiting ones in the "
       "budget left: prefills and decodes share a step",
       SCHEDULER, "nano-vllm, Vidur (vLLM scheduler)",
       (Scheduler, "_schedule_running", Wraps(_waiting_before_running)),
       (Scheduler, "admits_waiting", Wraps(_admits_waiting_once)))


# -- seats counted per step -----------------------------------------------------------------

def _keeping_the_plan(inner):
    """The step's plan kept on the scheduler, for the questions below that read it."""
    def schedule_part(self, plan: StepPlan) -> None:
        self._step_plan = plan
        inner(self, plan)
    return schedule_part


def _seat_in_this_step(self) -> bool:
    plan = self._step_plan
    return len(plan.new) + len(plan.resumed) + len(plan.running) < self.config.max_num_seqs


_running_tokens = Scheduler.running_tokens


def _running_tokens_while_seats(self, request, budget: int) -> int:
    return _running_tokens(self, request, budget) if _seat_in_this_step(self) else 0


design("seats_per_step",
       "at most max_num_seqs requests run at once (admission stops when the running list is "
       "full)",
       SCHEDULER, "nano-vllm",
       (Scheduler, "_schedule_waiting", Wraps(_keeping_the_plan)),
       (Scheduler, "_schedule_running", Wraps(_keeping_the_plan)),
       (Scheduler, "has_free_seat", _seat_in_this_step),
       (Scheduler, "running_tokens", _running_tokens_while_seats),
       (Scheduler, "_check_limits", lambda self, plan: None))


# -- the waiting head blocks the queue ------------------------------------------------------

_has = Config.has


def _misfit_stops_the_queue(self, rule_change: str) -> bool:
    return rule_change == "chunked_off_stops_at_first_misfit" or _has(self, rule_change)


design("misfit_blocks_the_queue",
       "with chunked prefill off, a waiting request that does not fit the budget left is "
       "passed over and the requests behind it are admitted (until 0.12.0)",
       SCHEDULER, "nano-vllm",
       (Config, "has", _misfit_stops_the_queue))


# -- hit pages and tokens counted as needed ----------------------------------------------------

_waiting_grant = Scheduler.waiting_grant
_fits_whole_sequence = Scheduler.fits_whole_sequence


def _grant_counting_hits(self, request, num_computed: int, plan: StepPlan, padding: int = 0):
    if not self.config.enable_chunked_prefill and request.num_tokens > plan.token_budget:
        return None  # the whole prompt, cached tokens too, must fit the budget
    return _waiting_grant(self, request, num_computed, plan, padding)


def _pages_for_the_whole_prompt(self, request, hit, num_computed: int) -> bool:
    pages = -(-request.num_tokens // self.config.block_size)
    return self.kv.pool.num_free_blocks() >= pages and \
        _fits_whole_sequence(self, request, hit, num_computed)


design("hits_counted_as_needed",
       "a waiting request needs budget for the tokens it computes and free pages for those "
       "not found in the prefix cache",
       SCHEDULER, "nano-vllm",
       (Scheduler, "waiting_grant", _grant_counting_hits),
       (Scheduler, "fits_whole_sequence", _pages_for_the_whole_prompt))


# -- freed pages forget their prefix ------------------------------------------------------

_free_blocks = BlockPool.free_blocks


def _free_forgetting(self, ordered, uncached_first: bool = False) -> None:
    """Pages no request holds any more are freed and their hashes dropped, silently (no
    eviction is ever seen)."""
    ordered = list(ordered)
    _free_blocks(self, ordered, uncached_first)
    for block in ordered:
        if block.ref_cnt == 0 and block.block_hash is not None and not block.is_null:
            pages = self.cached[block.block_hash]
            del pages[block.block_id]
            if not pages:
                del self.cached[block.block_hash]
            block.block_hash = None


design("freed_pages_forget_prefix",
       "a freed page keeps its cached prefix until it is handed out again: later requests, "
       "and a preempted one recomputing, hit it",
       BLOCK_POOL, "nano-vllm (fork 20260210)",
       (BlockPool, "free_blocks", _free_forgetting))


# -- the victim is the next in running order ------------------------------------------------

def _next_in_line(self):
    """The running request after the one being scheduled; the last one when it is last."""
    plan = self._step_plan
    after = plan.running_index + 1
    return self.running[after] if after < len(self.running) else self.running[-1]


design("victim_next_in_line",
       "fcfs preempts the request that joined the running list last",
       SCHEDULER, "nano-vllm (fork 20260210)",
       (Scheduler, "_schedule_running", Wraps(_keeping_the_plan)),
       (Scheduler, "fcfs_victim", _next_in_line))


# -- a decode needs a free page -------------------------------------------------------------

def _decode_needs_a_free_page(inner):
    def allocate_or_preempt(self, request, num_new: int, plan: StepPlan):
        """A request past its prefill is scheduled only while at least one page is free,
        whether or not its next token needs one (vLLM v0's ``can_append_slots``); while none
        is, the policy's victim is preempted, as when its pages run out."""
        while not request.left_mid_prefill and self.kv.pool.num_free_blocks() < 1:
            victim = self._pick_victim(plan)
            self._preempt(victim, plan)
            if victim is request:
                return None
        return inner(self, request, num_new, plan)
    return allocate_or_preempt


design("decode_needs_a_free_page",
       "a running request preempts only when the pages its new tokens need are not free",
       SCHEDULER, "Vidur (vLLM and Sarathi schedulers)",
       (Scheduler, "_allocate_or_preempt", Wraps(_decode_needs_a_free_page)))


# -- a prompt's pages all reserved at admission ------------------------------------------------

def _admitted(request) -> bool:
    """Whether ``allocate_slots`` is called for a waiting request (its admission)."""
    return request.status != RequestStatus.RUNNING


def _whole_prompt_reserved(inner):
    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=None, num_lookahead_tokens: int = 0, **kw):
        """A waiting request is admitted with pages for every token it has (its prompt, and a
        resumed one's outputs), though its first chunk computes fewer: the others are
        reserved as lookahead slots (not cached) and its later chunks need no page."""
        if _admitted(request):
            rest = request.num_tokens - request.num_computed_tokens - \
                num_new_computed_tokens - num_new_tokens
            num_lookahead_tokens = max(num_lookahead_tokens, rest)
        return inner(self, request, num_new_tokens, num_new_computed_tokens,
                     new_computed_blocks, num_lookahead_tokens, **kw)
    return allocate_slots


design("whole_prompt_reserved",
       "a request is given the pages of the tokens it computes in the step, chunk by chunk",
       KV_CACHE_MANAGER, "Vidur (Sarathi scheduler)",
       (KVCacheManager, "allocate_slots", Wraps(_whole_prompt_reserved)))


# -- a watermark of free pages at admission ---------------------------------------------------

#: The share of the pool an admission leaves free (Vidur's ``watermark_blocks_fraction``).
WATERMARK = 0.01


def _admission_watermark(inner):
    def allocate_slots(self, request, *args, reserved_blocks: int = 0, **kw):
        """A waiting request is admitted only if ``int(0.01 * pages)`` pages (the pool less
        the null page) stay free after its pages are taken."""
        if _admitted(request):
            reserved_blocks += int(WATERMARK * (self.pool.num_blocks - 1))
        return inner(self, request, *args, reserved_blocks=reserved_blocks, **kw)
    return allocate_slots


design("admission_watermark",
       "a waiting request is admitted when the free pages hold its new tokens, to the last page",
       KV_CACHE_MANAGER, "Vidur (vLLM and Sarathi schedulers; vLLM v0's watermark)",
       (KVCacheManager, "allocate_slots", Wraps(_admission_watermark)))
