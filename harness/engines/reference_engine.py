"""The clean-room reference behind the engine interface, at any release it describes.

Never imports vLLM.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from reference import engine_core, events, kv_sizing, releases
from reference.async_scheduler import AsyncScheduler
from reference.config import Config
from reference.encoder_cache import EncoderInput
from reference.kv_cache_spec import MAMBA, KVCacheSpec
from reference.request import Request, RequestStatus
from reference.scheduler import Scheduler
from reference.slot_mapping import WorkerBlockTable
from reference.structured_output import Grammar

from harness.formats.steps import (NEW, RESUMED, RUNNING, ConnectorScript, HashNumbers,
                                  Observed, RequestState, Scheduled, StepStates, kv_cache_header,
                                  counts_before, kv_event_records, page_runs, stats_record,
                                  to_scheduled)
from harness.formats.stream import RequestSpec, Stream, kv_cache_layout, largest_mm_item, lora_ids
from reference.arith import cdiv

#: Each status's name, as the trace writes it (an enum's ``name`` is slow to ask for every
#: request at every step).
_STATUS_NAMES = {status: status.name for status in RequestStatus}


def reference_config(stream: Stream, rules: frozenset[str] = frozenset()) -> Config:
    c = stream.config
    return Config(
        rules=rules,
        block_size=c.block_size, num_blocks=c.num_gpu_blocks,
        max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
        max_model_len=c.max_model_len, enable_chunked_prefill=c.enable_chunked_prefill,
        enable_prefix_caching=c.enable_prefix_caching,
        long_prefill_token_threshold=c.long_prefill_token_threshold, policy=c.policy,
        num_speculative_tokens=c.num_speculative_tokens, use_eagle=c.uses_eagle,
        kv_cache_groups=() if c.kv_cache_groups is None else group_specs(c),
        max_loras=c.max_loras, encoder_compute_budget=c.encoder_compute_budget,
        encoder_cache_size=c.encoder_cache_size, max_tokens_by_modality=modalities(stream),
        disable_chunked_mm_input=c.disable_chunked_mm_input,
        enable_kv_cache_events=c.kv_cache_events, async_scheduling=c.async_scheduling,
        pipeline_parallel_size=c.pipeline_parallel_size, log_stats=c.log_stats)


def modalities(stream: Stream) -> tuple[tuple[str, int], ...]:
    """The model's largest item per modality: every stream item is an image; a model with
    an encoder but no item length to go by reports none (as one whose modalities are off)."""
    largest = largest_mm_item(stream)
    return (("image", largest),) if stream.config.has_encoder and largest else ()


def group_specs(c) -> tuple[KVCacheSpec, ...]:
    """The stream's groups as the KV cache manager reads them (vLLM's runner derives the
    same: attention groups use block_size; a Mamba group's page holds max_model_len
    tokens and it keeps one extra page per speculative token)."""
    return tuple(
        KVCacheSpec(g.type, c.max_model_len if g.type == MAMBA else c.block_size,
                    sliding_window=g.sliding_window, attention_chunk_size=g.attention_chunk_size,
                    num_speculative_blocks=c.num_speculative_tokens if g.type == MAMBA else 0)
        for g in c.groups)


def worker_width(spec: KVCacheSpec, c) -> int:
    """Row width of the worker's block table of one group (vLLM's MultiGroupBlockTable)."""
    return max(cdiv(c.max_model_len, spec.block_size), 1 + c.num_speculative_tokens)


class Recorder:
    """Collects the reference's trace events for one step."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.observed = Observed()

    def __call__(self, event: events.Event) -> None:
        seen = self.observed
        if isinstance(event, events.Preempted):
            seen.preempted.append(event.request_id)
        elif isinstance(event, events.PrefixLookup):
            seen.hits[event.request_id] = event.num_hit_tokens
        elif isinstance(event, events.CachedBlockEvicted):
            seen.evicted.append(event.block_id)
        elif isinstance(event, events.SetAside):
            seen.set_aside.append(event.request_id)


class ScriptedConnector:
    """The harness's connector script behind the reference's KV connector protocol
    (reference.kv_connector.KVConnector)."""

    def __init__(self, script: ConnectorScript) -> None:
        self.script = script

    def get_num_new_matched_tokens(self, request: Request, num_local_hit: int):
        return self.script.matched_tokens(request.request_id, request.num_tokens, num_local_hit)

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        self.script.allocated(request.request_id, block_ids, num_external_tokens)

    def request_finished(self, request: Request, block_ids: list[int]) -> bool:
        return self.script.finished(request.request_id, block_ids)


class ValidationError(ValueError):
    """A config vLLM's start-up refuses: its config classes raise pydantic's
    ValidationError, which the trace names."""


class ReferenceEngine:
    """The reference, stating the rules of one vLLM release (0.11.0 unless told)."""

    name = "reference"

    def __init__(self, release: str = "0.11.0", rules: frozenset[str] | None = None):
        """``rules`` overrides the release's rule changes (the upgrade check tries them one by one)."""
        self.rules = releases.rules_of(release) if rules is None else frozenset(rules)
        self.release = release

    def version(self) -> str:
        return self.release

    def start(self, stream: Stream) -> None:
        self.config = reference_config(stream, self.rules)
        refusal = self.config.start_up_refusal()
        if refusal is not None:
            raise ValidationError(refusal)
        # A pool given as memory is the reference's own sizing of it, as the vLLM engines
        # size theirs with vLLM's: a sizing rule the two disagree on shows as a divergence.
        self.layout = None if stream.config.kv_cache_memory_bytes is None else self.sized(stream)
        if self.layout is not None:
            self.config = dataclasses.replace(self.config, num_blocks=self.layout.num_blocks)
        self.stream_config = stream.config
        self.lora_ids = lora_ids(stream)
        self.recorder = Recorder()
        self.script = ConnectorScript(stream) if stream.config.kv_role is not None else None
        scheduler = AsyncScheduler if self.config.async_scheduling else Scheduler
        self.sched = scheduler(self.config, self.recorder,
                               ScriptedConnector(self.script) if self.script else None)
        self._in_flight: deque = deque()  # scheduler outputs not yet updated, oldest first
        self.requests: dict[str, Request] = {}
        self.rows: dict[str, int] = {}
        self.workers = [WorkerTable(spec.block_size, worker_width(spec, stream.config))
                        for spec in self.config.groups]
        self.hash_numbers = HashNumbers()

    def sized(self, stream: Stream) -> kv_sizing.KVCacheLayout:
        """The pool start-up cuts from the stream's memory; a memory too small is refused
        as vLLM's start-up refuses it, with a ValueError."""
        try:
            return kv_cache_layout(stream.config,
                                   self.config.start_up_holds_back_null_page())
        except kv_sizing.NotEnoughKVCacheMemory as exc:
            raise ValueError(str(exc)) from None

    def reset_prefix_cache(self) -> bool:
        return self.sched.reset_prefix_cache()

    def abort(self, req_id: str) -> None:
        self.sched.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)

    def add(self, spec: RequestSpec, arrival_index: int) -> None:
        c = self.config
        req = Request(
            request_id=spec.id, prompt_token_ids=list(spec.prompt),
            max_tokens=spec.effective_max_tokens, arrival_time=float(arrival_index),
            priority=spec.priority, eos_token_id=spec.eos_token_id,
            stop_token_ids=tuple(spec.stop_token_ids), ignore_eos=spec.ignore_eos,
            cache_salt=spec.cache_salt, wants_prompt_logprobs=spec.prompt_logprobs is not None,
            lora_id=self.lora_ids.get(spec.lora),
            grammar=None if spec.structured_output is None
            else Grammar(frozenset(spec.structured_output.rejected_tokens)),
            encoder_inputs=tuple(EncoderInput(m.offset, m.length, m.hash) for m in spec.mm_inputs),
            pooling=spec.pooling, hash_block_size=c.block_size if c.enable_prefix_caching else None,
            mm_keys_with_offset=bool(spec.mm_inputs) and c.mm_keys_carry_the_offset())
        self.requests[spec.id] = req
        self.rows[spec.id] = arrival_index
        self.sched.add_request(req)

    def num_unfinished(self) -> int:
        return self.sched.num_unfinished()

    def refuses(self, stream: Stream) -> str | None:
        return None  # takes every valid stream

    def has_requests(self) -> bool:
        return self.sched.has_requests()

    def schedule(self) -> Scheduled:
        before, pending = counts_before(self.sched.requests)
        self.recorder.clear()
        out = self.sched.schedule()
        self._in_flight.append(out)
        # Plain (req_id, kind, block_ids, num_computed_tokens) tuples: see Handed.
        handed = [(d.req_id, NEW, d.block_ids, d.num_computed_tokens)
                  for d in out.scheduled_new_reqs]
        handed += [(d.req_id, RESUMED if d.resumed_from_preemption else RUNNING,
                    d.new_block_ids, d.num_computed_tokens)
                   for d in out.scheduled_cached_reqs]
        reqs = self.requests
        scheduled = to_scheduled(
            handed, out.num_scheduled_tokens.items(), out.scheduled_spec_decode_tokens,
            out.finished_req_ids, before, self.recorder.observed, self.workers, self.rows,
            lambda rid: (reqs[rid].num_tokens, reqs[rid].num_output_tokens),
            out.grammar.batch_index, [(r.request_id, r.grammar_state) for r in out.grammar.rows],
            out.scheduled_encoder_inputs, out.free_encoder_mm_hashes, pending)
        return scheduled

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]],
               finished_recving: list[str] = (), finished_sending: list[str] = ()) -> None:
        self._stats = self.sched.update_from_output(self._in_flight.popleft(), sampled,
                                                    finished_recving, finished_sending)

    def connector_calls(self) -> list[list]:
        return self.script.take_calls() if self.script else []

    def stats(self) -> dict | None:
        s = self._stats
        return stats_record(s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage,
                            s.prefix_cache, s.spec_decoding,
                            preempted_apart=self.config.prefix_stats_split_preempted(),
                            num_set_aside=s.num_set_aside)

    def kv_events(self) -> list[dict]:
        published, self.sched.published_kv_events = self.sched.published_kv_events, []
        return kv_event_records(published, self.hash_numbers)

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        self.sched.update_draft_token_ids(drafts)

    def grammar_ready(self, req_id: str) -> None:
        self.requests[req_id].grammar.ready = True

    def state(self, req_id: str) -> RequestState:
        r = self.requests[req_id]
        return RequestState(_STATUS_NAMES[r.status], r.num_computed_tokens, r.num_output_tokens,
                            r.num_output_placeholders)

    def step_states(self, req_ids: list[str], placeholders: bool) -> StepStates:
        """:meth:`state` of each request as the step record holds it (see
        :func:`harness.formats.steps.step_states`)."""
        reqs = self.requests
        status, computed = {}, {}
        for rid in req_ids:
            r = reqs[rid]
            status[rid] = _STATUS_NAMES[r.status]
            computed[rid] = r.num_computed_tokens
        return StepStates(status, computed, {rid: reqs[rid].num_output_placeholders
                                             for rid in req_ids} if placeholders else None)

    def kv_cache_header(self) -> dict | None:
        layout = self.layout
        if layout is None:
            return None
        shape, size = layout.shape, layout.block_size
        pages_first, kv_in_last_dim = self.config.kv_tensor_layout()
        return kv_cache_header(layout.num_blocks, size, shape.num_layers,
                               shape.page_size_bytes(size),
                               kv_sizing.flash_attention_shape(
                                   layout.num_blocks, size, shape.num_kv_heads, shape.head_size,
                                   pages_first=pages_first, kv_in_last_dim=kv_in_last_dim))

    def applies_oldest_now(self, in_flight: int, runs_work: bool, worker_done: bool) -> bool:
        size = engine_core.batch_queue_size(self.config.async_scheduling,
                                            self.config.pipeline_parallel_size)
        if self.config.batch_queue_fills_before_applying():
            return engine_core.applies_oldest_when_full(in_flight, size, runs_work,
                                                        self.has_requests())
        return engine_core.applies_oldest_now(in_flight, size, runs_work, worker_done)

    def end_step(self) -> None:
        """The reference's step is over once updated."""

    def shutdown(self) -> None:
        """The reference holds nothing to let go of."""

    def num_free_blocks(self) -> int:
        return self.sched.kv.pool.num_free_blocks()


class WorkerTable(WorkerBlockTable):
    """The reference's worker block table, read a page at a time for the trace's slot runs
    (what :func:`harness.formats.steps.slot_ranges` makes of :meth:`slots`): each page's
    run starts at the reference's own ``slot_of`` (the block-table rule, which its mutant
    replaces) and goes on one slot per position to the page's end.

    (Last in the file: an engine failure's message names the line it was raised at, and
    a trace keeps its bytes.)"""

    def slot_runs(self, row: int, first_position: int, num_tokens: int) -> list[list[int]]:
        table = self._row(row)
        return page_runs(lambda p: self.slot_of(table, p), self.block_size, first_position,
                         num_tokens)
