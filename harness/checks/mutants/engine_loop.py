"""Mutants of the loop around the scheduler: a KV connector, the engine loop
(vllm/v1/engine/core.py) and async scheduling."""

from __future__ import annotations

from harness.checks.mutants.applies import (
    async_scheduling,
    batch_queue,
    connector,
    connector_async,
    connector_async_caching,
    connector_sends,
    connector_unknown,
    pipeline_parallel,
)
from harness.checks.mutants.registry import mutant
from harness.formats.mutant import ENGINE_CORE, KV_CACHE_MANAGER, SCHEDULER
from reference import async_scheduler as rasync
from reference import engine_core as rengine
from reference import kv_cache_manager as rkv
from reference import kv_sizing as rkvs
from reference import scheduler as rsched
from reference.request import RequestStatus

KV_CONNECTOR_BASE = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"


@mutant("remote_kv_not_awaited", "a request loading asynchronously waits until the worker "
        "reports the load done", SCHEDULER, replaces=(rsched.Scheduler, "waits_for_remote_kv"),
        applies=connector_async)
def _load_taken_as_done(self, request):
    if request.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
        return False
    self.finished_recving.add(request.request_id)
    self._take_loaded_tokens(request)
    request.status = RequestStatus.WAITING
    return False


@mutant("loaded_last_token_not_recomputed", "after a load that covers every token, the last "
        "one is computed again", SCHEDULER, replaces=(rsched, "tokens_after_load"),
        applies=connector_async)
def _every_loaded_token_kept(num_pages, block_size, num_tokens):
    return min(num_pages * block_size, num_tokens)


@mutant("connector_asked_after_load", "only a request with nothing computed asks the "
        "connector", SCHEDULER, replaces=(rsched.Scheduler, "external_hit"),
        applies=connector)  # a loaded request, or 0.11.0's priority victim
def _asked_again(self, request, num_hit):
    if self.connector is None:
        return 0, False
    num_external, load_async = self.connector.get_num_new_matched_tokens(request, num_hit)
    if num_external is None:
        return None
    if request.num_computed_tokens > 0:
        return num_external, False
    return num_external, load_async


@mutant("unknown_answer_taken_as_zero", "a connector that cannot tell yet sets the request "
        "aside for the step", SCHEDULER, replaces=(rsched.Scheduler, "external_hit"),
        applies=connector_unknown)
def _unknown_as_nothing(self, request, num_hit):
    answer = _external_hit(self, request, num_hit)
    return (0, False) if answer is None else answer


_external_hit = rsched.Scheduler.external_hit


@mutant("kept_pages_freed_at_once", "a finished request's pages stay held while the "
        "connector sends them", SCHEDULER, replaces=(rsched.Scheduler, "_free_request"),
        applies=connector_sends)
def _free_despite_sending(self, request, keep_pages=False):
    self.connector_keeps_pages(request)
    self.encoder_cache.free(request)
    self.finished_req_ids.add(request.request_id)
    self._free_pages(request)


@mutant("send_report_ignored", "pages kept for sending are freed when the worker reports "
        "the send done", SCHEDULER, replaces=(rsched.Scheduler, "take_transfers"),
        applies=connector_sends)
def _sends_never_done(self, finished_recving, finished_sending):
    self.finished_recving.update(finished_recving)


@mutant("connector_told_new_pages_only", "the connector is told the request's hit pages "
        "and its new pages, hits first", SCHEDULER,
        replaces=(rsched.Scheduler, "tell_connector_pages"), applies=connector)
def _new_pages_only(self, request, hit, new_blocks, num_external):
    if self.connector is not None:
        self.connector.update_state_after_alloc(
            request, [b.block_id for b in new_blocks[0]], num_external)


@mutant("async_load_cached_at_once", "pages a load fills are cached when the load is done, "
        "not when they are given", KV_CACHE_MANAGER,
        replaces=(rkv.KVCacheManager, "allocate_slots"), applies=connector_async_caching)
def _cache_before_load(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0, delay_caching=False,
                       num_external_tokens=0, **more):
    return _allocate_slots(self, request, num_new_tokens, num_new_computed_tokens,
                           new_computed_blocks, num_lookahead_tokens,
                           num_external_tokens=num_external_tokens, **more)


_allocate_slots = rkv.KVCacheManager.allocate_slots


# -- the engine loop (vllm/v1/engine/core.py) ----------------------------------------------
@mutant("engine_steps_while_idle", "EngineCore does not step without requests: an idle "
        "step publishes no KV events and reports no stats", ENGINE_CORE,
        replaces=(rsched.Scheduler, "has_requests"))
def _always_busy(self):
    return True


@mutant("finished_told_only_with_work", "a step runs to tell the worker of finished "
        "requests, with nothing else to do", ENGINE_CORE,
        replaces=(rsched.Scheduler, "has_requests"))
def _unfinished_only(self):
    return self.num_unfinished() > 0


@mutant("flash_layout_for_any_block_size", "the flash-attention backend refuses a block "
        "size that is not a multiple of 16 (no tensor layout in the trace header)",
        "vllm/v1/attention/backends/flash_attn.py",
        replaces=(rkvs, "flash_attention_shape"),
        applies=lambda s: s.config.kv_cache_memory_bytes is not None)
def _flash_layout_always(num_blocks, block_size, num_kv_heads, head_size, pages_first=False,
                         kv_in_last_dim=False):
    return rkvs.kv_cache_tensor_shape(num_blocks, block_size, num_kv_heads, head_size)


ASYNC_SCHEDULER = "vllm/v1/core/sched/async_scheduler.py"


@mutant("batch_applied_at_once", "with a batch queue a step does not wait for the "
        "batch it just scheduled while the queue has room and the worker is busy",
        ENGINE_CORE, replaces=(rengine, "applies_oldest_now"), applies=batch_queue)
def _always_waits(in_flight, queue_size, runs_work, worker_done):
    return True


@mutant("worker_done_not_looked_at", "a batch the worker has already finished is applied "
        "in the step that scheduled it", ENGINE_CORE,
        replaces=(rengine, "applies_oldest_now"), applies=batch_queue)
def _never_done(in_flight, queue_size, runs_work, worker_done):
    return not (runs_work and in_flight < queue_size)


@mutant("empty_batch_does_not_wait", "a step whose batch runs no work waits for the oldest "
        "batch in flight", ENGINE_CORE, replaces=(rengine, "applies_oldest_now"),
        applies=batch_queue)
def _empty_returns_early(in_flight, queue_size, runs_work, worker_done):
    return in_flight >= queue_size or worker_done


@mutant("pipeline_stages_ignored", "under pipeline parallelism EngineCore keeps as many "
        "batches in flight as there are stages", ENGINE_CORE,
        replaces=(rengine, "batch_queue_size"), applies=pipeline_parallel)
def _queue_of_two(async_scheduling, pipeline_parallel_size=1):
    return 2 if async_scheduling or pipeline_parallel_size > 1 else 1


@mutant("placeholders_not_scheduled", "a running request's output placeholders count as "
        "tokens to compute", SCHEDULER, replaces=(rsched.Scheduler, "running_tokens"),
        applies=async_scheduling)
def _without_placeholders(self, request, budget):
    num_new = self.cap_long_prefill(request.num_tokens_with_spec - request.num_computed_tokens)
    return self.cap_model_len(request, min(num_new, budget))


@mutant("sampling_ignores_placeholders", "a grant samples (takes a placeholder) when it "
        "reaches every known token and every placeholder", ASYNC_SCHEDULER,
        replaces=(rasync, "samples_now"), applies=async_scheduling)
def _samples_at_known_tokens(request):
    return request.num_computed_tokens == request.num_tokens


@mutant("async_outputs_not_cached", "under async scheduling the pages a batch's tokens fill "
        "are cached when its output is applied", ASYNC_SCHEDULER,
        replaces=(rasync.AsyncScheduler, "_append_outputs"), applies=async_scheduling)
def _append_without_caching(self, request, tokens):
    kept, stopped = rsched.Scheduler._append_outputs(self, request, tokens)
    request.num_output_placeholders -= len(kept)
    return kept, stopped


@mutant("placeholders_kept_after_output", "a token applied takes its placeholder's place",
        ASYNC_SCHEDULER, replaces=(rasync.AsyncScheduler, "_append_outputs"),
        applies=async_scheduling)
def _append_keeping_placeholders(self, request, tokens):
    was_running = request.status == RequestStatus.RUNNING
    kept, stopped = rsched.Scheduler._append_outputs(self, request, tokens)
    if was_running:
        self.kv.cache_blocks(request, request.num_computed_tokens
                             - request.num_output_placeholders)
    return kept, stopped
