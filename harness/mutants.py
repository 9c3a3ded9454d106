"""Mutants: one-rule deviations that the conformance run must catch.

Each reference mutant breaks one rule of the reference at run time (a patch
applied for the duration of a run; no source is edited) and names the rule
and the vLLM 0.11.0 module the rule lives in.  Each vLLM mutant monkeypatches
the real vLLM the same way, standing in for an upgrade that changed
behaviour.  ``python -m harness mutants`` runs the conformance properties
against each mutant and reports whether it was killed, after how many
generated streams, and the size of the shrunk counterexample.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator
from unittest import mock

from reference import block_pool as rbp
from reference import kv_cache_manager as rkv
from reference import request as rreq
from reference import request_queue as rq
from reference import scheduler as rsched
from reference import slot_mapping as rslots
from reference.request import RequestStatus

Patch = Callable[[], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str
    mirrors: str  # the vLLM 0.11.0 module whose rule it breaks
    patch: Patch
    side: str = "reference"  # or "vllm"
    # Why no stream can tell this mutant from the original, when that is so.
    equivalent: str = ""


def _replace(obj, attr: str, new) -> Patch:
    return lambda: mock.patch.object(obj, attr, new)


def _all(*patches: Patch) -> Patch:
    @contextlib.contextmanager
    def combined() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p())
            yield
    return combined


# -- reference mutants: the replacement functions --------------------------------------

def _free_forward(self, request):
    table = self.req_to_blocks.pop(request.request_id, [])
    self.pool.free_blocks(table)
    self.num_cached_block.pop(request.request_id, None)


def _popleft_from_tail(self, n):
    taken = []
    for _ in range(n):
        block = self._tail.prev_free
        self._unlink(block)
        taken.append(block)
    return taken


def _pick_first_running(self, plan):
    if self.config.policy == "priority":
        return _ORIG_PICK(self, plan)
    return self.running.pop(0)


def _pick_by_arrival_only(self, plan):
    if self.config.policy != "priority":
        return _ORIG_PICK(self, plan)
    victim = max(self.running, key=lambda r: r.arrival_time)
    self.running.remove(victim)
    if victim in plan.running:
        plan.running.remove(victim)
    return victim


def _running_with_fixed_priority_quirk(self, plan):
    """vLLM after PR #26661: a preempted victim loses its grant in this step."""
    _ORIG_RUNNING(self, plan)
    for victim in plan.preempted:
        n = plan.num_scheduled_tokens.pop(victim.request_id, None)
        if n is not None:
            plan.token_budget += n
            plan.new_block_ids.pop(victim.request_id, None)
            plan.spec_tokens.pop(victim.request_id, None)


def _hit_without_last_token_cap(self, request):
    if not self.enable_caching or request.wants_prompt_logprobs:
        hit = []
    else:
        hit = self.longest_cache_hit(request.block_hashes, request.num_tokens)
    self.emit(rsched.events.PrefixLookup(request.request_id, len(hit) * self.block_size))
    return hit, len(hit) * self.block_size


def _hit_partial_block(self, block_hashes, max_length):
    # Round the limit up to whole pages, so a partly covered page may hit.
    return _ORIG_HIT(self, block_hashes, rkv.cdiv(max_length, self.block_size) * self.block_size)


def _eagle_keeps_last_hit(self, block_hashes, max_length):
    with mock.patch.object(self, "use_eagle", False):
        return _ORIG_HIT(self, block_hashes, max_length)


def _prompt_logprobs_hit(self, request):
    hit = self.longest_cache_hit(request.block_hashes, request.num_tokens - 1) \
        if self.enable_caching else []
    self.emit(rsched.events.PrefixLookup(request.request_id, len(hit) * self.block_size))
    return hit, len(hit) * self.block_size


def _cache_drafts(self, request, num_tokens):
    # Treat drafts as final: hash and cache the pages they fill too.
    tokens = request.all_token_ids + request.spec_token_ids
    hashes = list(request.block_hashes)
    _ORIG_EXTEND(hashes, tokens, self.block_size, request.cache_salt)
    num_full = min(num_tokens + len(request.spec_token_ids), len(tokens)) // self.block_size
    self.pool.cache_full_blocks(hashes, self.req_to_blocks[request.request_id],
                                self.num_cached_block[request.request_id], num_full)
    self.num_cached_block[request.request_id] = max(num_full, self.num_cached_block[request.request_id])


def _pages_ignoring_free_hits(self, table, num_slots, hit):
    return rkv.cdiv(num_slots, self.block_size) - len(hit) - len(table)


def _keep_hash_on_reuse(self, block):
    return None


def _no_null_block_init(self, num_blocks, enable_caching, emit=rbp.events.ignore):
    _ORIG_POOL_INIT(self, num_blocks, enable_caching, emit)
    self.free_queue.append_n([self.null_block])  # page 0 handed out like any other
    self.null_block.is_null = False


def _break_on_zero(self, plan):
    index = 0
    while index < len(self.running) and plan.token_budget > 0:
        request = self.running[index]
        num_new = self.running_tokens(request, plan.token_budget)
        if num_new == 0:
            break
        new_blocks = self._allocate_or_preempt(request, num_new, plan)
        if new_blocks is None:
            break
        plan.running.append(request)
        plan.grant(request, num_new, [b.block_id for b in new_blocks])
        index += 1
        self._schedule_drafts(request, num_new, plan)


def _threshold_after_budget(self, request, budget):
    num_new = min(request.num_tokens_with_spec - request.num_computed_tokens, budget)
    num_new = self.cap_long_prefill(num_new)
    return min(num_new, self.config.max_model_len - 1 - request.num_computed_tokens)


def _waiting_without_threshold(self, plan):
    with mock.patch.object(self, "cap_long_prefill", lambda n: n):
        _ORIG_WAITING(self, plan)


def _model_len_off_by_one(self, request, budget):
    num_new = self.cap_long_prefill(request.num_tokens_with_spec - request.num_computed_tokens)
    num_new = min(num_new, budget)
    return min(num_new, self.config.max_model_len - request.num_computed_tokens)


def _no_draft_trim(self, request, num_new, plan):
    if request.spec_token_ids and num_new + request.num_computed_tokens - request.num_tokens > 0:
        plan.spec_tokens[request.request_id] = request.spec_token_ids


def _rejected_not_subtracted(self, output, sampled):
    drafts = output.scheduled_spec_decode_tokens
    saved = dict(drafts)
    drafts.clear()
    try:
        _ORIG_UPDATE(self, output, sampled)
    finally:
        drafts.update(saved)


def _append_past_stop(self, request, tokens):
    stopped = False
    for token in tokens:
        request.append_output_token(token)
        stopped = rsched.check_stop(request, self.config.max_model_len) or stopped
    return stopped


def _finished_not_cleared(self, output):
    for req_id, n in output.num_scheduled_tokens.items():
        self.requests[req_id].num_computed_tokens += n
    self.finished_req_ids = set(self.finished_req_ids)


def _skipped_to_tail(self, other):
    for request in other:
        self.add(request)


def _eos_ignored(request, max_model_len):
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if request.output_token_ids[-1] in request.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    return False


def _slots_from_page_start(self, row, first_position, num_tokens):
    table = self._row(row)
    bs = self.block_size
    return [table[p // bs] * bs for p in range(first_position, first_position + num_tokens)]


def _extend_without_salt(hashes, tokens, block_size, cache_salt):
    _ORIG_EXTEND(hashes, tokens, block_size, None)


def _reset_always(self):
    self.cached = {}
    for block in self.blocks:
        block.block_hash = None
    return True


def _preempt_keeps_progress(self, victim, plan):
    computed = victim.num_computed_tokens
    _ORIG_PREEMPT(self, victim, plan)
    victim.num_computed_tokens = min(computed, victim.num_tokens - 1)


def _seats_off_by_one(self, plan):
    with mock.patch.object(self, "config", _Seats(self.config)):
        _ORIG_WAITING(self, plan)


class _Seats:
    def __init__(self, config):
        self._c = config

    def __getattr__(self, name):
        value = getattr(self._c, name)
        return value + 1 if name == "max_num_seqs" else value


_ORIG_PICK = rsched.Scheduler._pick_victim
_ORIG_HIT = rkv.KVCacheManager.longest_cache_hit
_ORIG_POOL_INIT = rbp.BlockPool.__init__
_ORIG_RUNNING = rsched.Scheduler._schedule_running
_ORIG_WAITING = rsched.Scheduler._schedule_waiting
_ORIG_UPDATE = rsched.Scheduler.update_from_output
_ORIG_PREEMPT = rsched.Scheduler._preempt
_ORIG_EXTEND = rreq.extend_block_hashes

S, K, P, Q, U = ("vllm/v1/core/sched/scheduler.py", "vllm/v1/core/kv_cache_manager.py",
                 "vllm/v1/core/block_pool.py", "vllm/v1/core/sched/request_queue.py",
                 "vllm/v1/core/sched/utils.py")
SK = "vllm/v1/core/single_type_kv_cache_manager.py"
KU = "vllm/v1/core/kv_cache_utils.py"

REFERENCE_MUTANTS = [
    Mutant("free_forward_order", "a request's pages are freed tail first", SK,
           _replace(rkv.KVCacheManager, "free", _free_forward)),
    Mutant("evict_from_tail", "new pages come from the head of the free queue", KU,
           _replace(rbp.FreeBlockQueue, "popleft_n", _popleft_from_tail)),
    Mutant("fcfs_preempt_first_running", "fcfs preempts the last running request", S,
           _replace(rsched.Scheduler, "_pick_victim", _pick_first_running)),
    Mutant("priority_victim_by_arrival_only", "priority victim is the max (priority, arrival)", S,
           _replace(rsched.Scheduler, "_pick_victim", _pick_by_arrival_only)),
    Mutant("waiting_admitted_after_preemption", "no waiting request is admitted in a step that preempted", S,
           _replace(rsched.Scheduler, "admits_waiting", lambda self, plan: True)),
    Mutant("priority_quirk_fixed", "0.11.0 keeps a preempted victim's grant (fixed by PR #26661)", S,
           _replace(rsched.Scheduler, "_schedule_running", _running_with_fixed_priority_quirk)),
    Mutant("hit_without_last_token_cap", "a prefix hit leaves at least the last token to compute", K,
           _replace(rkv.KVCacheManager, "get_computed_blocks", _hit_without_last_token_cap)),
    Mutant("hit_on_partial_block", "prefix hits cover whole pages within num_tokens - 1", SK,
           _replace(rkv.KVCacheManager, "longest_cache_hit", _hit_partial_block)),
    Mutant("eagle_keeps_last_hit", "eagle drops the last hit page", SK,
           _replace(rkv.KVCacheManager, "longest_cache_hit", _eagle_keeps_last_hit)),
    Mutant("prompt_logprobs_get_hits", "requests with prompt logprobs skip the prefix cache", K,
           _replace(rkv.KVCacheManager, "get_computed_blocks", _prompt_logprobs_hit)),
    Mutant("cache_salt_ignored", "cache_salt is an extra key of the first block", KU,
           _replace(rreq, "extend_block_hashes", _extend_without_salt)),
    Mutant("cache_draft_tokens", "only real tokens are cached, never drafts", K,
           _replace(rkv.KVCacheManager, "cache_blocks", _cache_drafts)),
    Mutant("free_hits_not_counted", "prefix hits on free pages count as pages to allocate", SK,
           _replace(rkv.KVCacheManager, "pages_to_allocate", _pages_ignoring_free_hits)),
    Mutant("hash_kept_on_reuse", "a cached page handed out again loses its hash", P,
           _replace(rbp.BlockPool, "_evict_if_cached", _keep_hash_on_reuse)),
    Mutant("no_null_block", "page 0 is the null page, never handed out", P,
           _replace(rbp.BlockPool, "__init__", _no_null_block_init)),
    Mutant("break_on_zero_tokens", "a running request with 0 tokens is skipped (continue)", S,
           _replace(rsched.Scheduler, "_schedule_running", _break_on_zero),
           equivalent="with synchronous scheduling a running request always has >= 1 token to "
                      "compute (it holds num_tokens - 1 computed, and num_tokens < max_model_len); "
                      "0 needs async scheduling, pipeline parallelism or encoder budgets"),
    Mutant("threshold_after_budget", "long-prefill threshold applies before the budget", S,
           _replace(rsched.Scheduler, "running_tokens", _threshold_after_budget),
           equivalent="a positive threshold caps like min(n, threshold), and min commutes with "
                      "the budget's min: both orders give the same count"),
    Mutant("threshold_ignored_when_waiting", "the long-prefill threshold caps waiting requests too", S,
           _replace(rsched.Scheduler, "_schedule_waiting", _waiting_without_threshold)),
    Mutant("model_len_cap_off_by_one", "tokens are capped at max_model_len - 1 - computed", S,
           _replace(rsched.Scheduler, "running_tokens", _model_len_off_by_one)),
    Mutant("resumed_prompt_only", "a resumed request recomputes prompt and outputs", S,
           _replace(rreq.Request, "num_tokens",
                    property(lambda r: len(r.all_token_ids) if r.status != RequestStatus.PREEMPTED
                             else len(r.prompt_token_ids)))),
    Mutant("eagle_no_lookahead", "eagle reserves num_speculative_tokens lookahead slots",
           "vllm/v1/core/sched/scheduler.py",
           _replace(rsched.Config, "num_lookahead_tokens", property(lambda c: 0))),
    Mutant("drafts_not_trimmed", "scheduled drafts are trimmed to the granted tokens", S,
           _replace(rsched.Scheduler, "_schedule_drafts", _no_draft_trim)),
    Mutant("rejected_drafts_not_subtracted", "rejected drafts are taken back from num_computed_tokens", S,
           _replace(rsched.Scheduler, "update_from_output", _rejected_not_subtracted)),
    Mutant("tokens_after_stop_kept", "tokens after a stop are dropped", S,
           _replace(rsched.Scheduler, "_append_outputs", _append_past_stop)),
    Mutant("eos_ignored", "EOS stops a request unless ignore_eos", U,
           _replace(rsched, "check_stop", _eos_ignored)),
    Mutant("finished_reported_again", "finished ids are reported once, on the next step", S,
           _replace(rsched.Scheduler, "_advance_computed_tokens", _finished_not_cleared)),
    Mutant("skipped_waiting_to_tail", "with chunked prefill off, skipped requests go back to the head", Q,
           _replace(rq.FcfsQueue, "prepend_all", _skipped_to_tail)),
    Mutant("preempted_keep_progress", "a preempted request's num_computed_tokens drops to 0", S,
           _replace(rsched.Scheduler, "_preempt", _preempt_keeps_progress)),
    Mutant("max_num_seqs_off_by_one", "at most max_num_seqs requests run", S,
           _replace(rsched.Scheduler, "_schedule_waiting", _seats_off_by_one)),
    Mutant("slot_offset_ignored", "a token's slot is page * block_size + its offset in the page",
           "vllm/v1/worker/block_table.py",
           _replace(rslots.WorkerBlockTable, "slots", _slots_from_page_start)),
    Mutant("reset_prefix_cache_always", "reset_prefix_cache is refused while pages are in use", P,
           _replace(rbp.BlockPool, "reset_prefix_cache", _reset_always)),
]


# -- vLLM mutants: an "upgrade" that changed one rule -----------------------------------

def _vllm_patches() -> list[Mutant]:
    import harness.engines.vllm_adapter  # noqa: F401  (sets vLLM's offline, quiet environment first)
    from vllm.v1.core import single_type_kv_cache_manager as stm
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.sched import scheduler as vsched

    orig_check_stop = vsched.check_stop

    def free_forward(self, request_id):
        blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(blocks)
        self.num_cached_block.pop(request_id, None)

    def stop_tokens_ignored(request, max_model_len, pooler_output=None):
        saved = request.sampling_params.stop_token_ids
        request.sampling_params.stop_token_ids = []
        try:
            return orig_check_stop(request, max_model_len, pooler_output)
        finally:
            request.sampling_params.stop_token_ids = saved

    orig_get_new = BlockPool.get_new_blocks

    def new_blocks_reversed(self, num_blocks):
        return list(reversed(orig_get_new(self, num_blocks)))

    return [
        Mutant("vllm_free_forward_order", "upgrade frees pages head first", SK,
               _replace(stm.SingleTypeKVCacheManager, "free", free_forward), side="vllm"),
        Mutant("vllm_stop_tokens_ignored", "upgrade stops honouring stop_token_ids", U,
               _replace(vsched, "check_stop", stop_tokens_ignored), side="vllm"),
        Mutant("vllm_new_blocks_reversed", "upgrade hands out new pages in reverse order", P,
               _replace(BlockPool, "get_new_blocks", new_blocks_reversed), side="vllm"),
    ]


def catalogue(include_vllm: bool = True) -> list[Mutant]:
    return REFERENCE_MUTANTS + (_vllm_patches() if include_vllm else [])


# -- running them ------------------------------------------------------------------------

@dataclass
class Result:
    mutant: Mutant
    killed: bool
    examples: int  # streams generated before the first divergence
    shrunk_requests: int | None
    shrunk_steps: int | None
    by: str  # which property killed it
    seconds: float
    report: str = ""  # the divergence report on the shrunk stream


def hunt(mutant: Mutant, max_examples: int = 200, budget: float | None = None,
         shrink: bool = True) -> Result:
    """Run the conformance properties against one mutant until one of them fails.

    Without ``shrink`` the first failing stream is reported as found (faster).
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from harness import strategies as st
    from harness.conformance import Divergent, assert_conforms, engine
    from harness.stream import parse_stream

    vllm, ref = engine("vllm"), engine("reference")
    started = time.monotonic()
    properties = [("any_stream", st.any_stream), ("preemption", st.preemption_streams),
                  ("prefix_cache", st.prefix_cache_streams), ("chunked_prefill", st.chunked_prefill_streams),
                  ("spec_decode", st.spec_decode_streams), ("stops_and_aborts", st.stop_and_abort_streams)]
    seen = 0
    for label, strategy in properties:
        if budget is not None and time.monotonic() - started > budget:
            break
        first_failure: list[int] = []
        last_failing: list[dict] = []
        last_report: list[str] = []

        phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

        @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), print_blob=False, phases=phases)
        @given(strategy())
        def prop(data):
            nonlocal seen
            seen += 1
            try:
                with mutant.patch():
                    assert_conforms(data, label=f"mutant-{mutant.name}", reference=ref, vllm=vllm)
            except Divergent as exc:
                if not first_failure:
                    first_failure.append(seen)
                last_failing[:] = [data]
                last_report[:] = [str(exc)]
                raise

        try:
            prop()
        except Divergent:
            data = last_failing[0]
            with mutant.patch():
                from harness.runner import run
                steps = len(run(vllm, parse_stream(data)).steps)
            return Result(mutant, True, first_failure[0], len(data["requests"]), steps, label,
                          time.monotonic() - started, last_report[0])
    return Result(mutant, False, seen, None, None, "-", time.monotonic() - started)


def table(results: list[Result]) -> str:
    rows = [("mutant", "side", "killed", "examples", "shrunk reqs", "shrunk steps", "killed by",
             "rule broken", "vLLM module")]
    for r in results:
        killed = "yes" if r.killed else "equivalent" if r.mutant.equivalent else "NO"
        rows.append((r.mutant.name, r.mutant.side, killed, str(r.examples),
                     str(r.shrunk_requests or "-"), str(r.shrunk_steps or "-"), r.by,
                     r.mutant.rule, r.mutant.mirrors))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(budget: float | None = None, names: list[str] | None = None,
         show_reports: bool = False) -> int:
    import sys
    mutants = [m for m in catalogue() if not names or m.name in names]
    if names and len(mutants) != len(set(names)):
        known = {m.name for m in catalogue()}
        print(f"error: unknown mutant(s): {', '.join(sorted(set(names) - known))}", file=sys.stderr)
        return 2
    results = []
    for m in mutants:
        if m.equivalent:
            results.append(Result(m, False, 0, None, None, "equivalent", 0.0))
            print(f"{m.name}: equivalent, not hunted ({m.equivalent})", file=sys.stderr)
            continue
        r = hunt(m, budget=budget)
        results.append(r)
        print(f"{m.name}: {'killed' if r.killed else 'SURVIVED'} after {r.examples} stream(s) "
              f"({r.seconds:.1f} s)", file=sys.stderr)
    print(table(results))
    if show_reports:
        for r in results:
            if r.report:
                print(f"\n### {r.mutant.name}\n\n{r.report}")
    survivors = [r.mutant.name for r in results if not r.killed and not r.mutant.equivalent]
    equivalents = [r.mutant for r in results if r.mutant.equivalent]
    hunted = len(results) - len(equivalents)
    print(f"\n{hunted - len(survivors)}/{hunted} mutants killed"
          + (f"; survivors: {', '.join(survivors)}" if survivors else ""))
    for m in equivalents:
        print(f"equivalent (cannot be killed): {m.name}: {m.equivalent}")
    return 1 if survivors else 0
