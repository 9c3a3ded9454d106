"""The step vocabulary: what one step of a run is, and the engine interface that makes it.

It sits below the scripted model, the trace and the step loop, which use its records,
and below ``harness/engines/``, whose engines make them (only the engines touch vLLM).

Both engines turn one ``schedule()`` call into a :class:`Scheduled` record with
plain Python values (no vLLM types), so the step loop, the scripted model and
the trace writer are shared and never know which engine they drive.  The
translation itself is written once, in :func:`to_scheduled`: an engine only
lists what its scheduler output handed to the worker (:class:`Handed`) and
what its hooks saw (:class:`Observed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple, Protocol

from harness.formats.stream import RequestSpec, Stream


@dataclass
class Scheduled:
    """What one ``schedule()`` call decided, in engine-neutral form.

    One made by hand (an engine of one's own, an engine process) is copied into the
    step record's shapes when its step is recorded (:func:`translated`); one that
    :func:`to_scheduled` makes is already in them (:class:`Translated`).
    """

    # [(req_id, n_tokens)] in the order of vLLM's num_scheduled_tokens dict.
    scheduled: list[tuple[str, int]]
    # {req_id: [[block ids of group 0]]} as handed to the worker.
    new_block_ids: dict[str, list[list[int]]]
    # Request ids preempted during this schedule() call, in order.
    preempted: list[str]
    # finished_req_ids carried by this step's output.
    finished: list[str]
    # {req_id: tokens found in the prefix cache} for requests admitted this step.
    prefix_hit_tokens: dict[str, int]
    # {req_id: scheduled draft tokens}.
    spec_tokens: dict[str, list[int]]
    # Per scheduled request: num_computed_tokens as the worker sees it before
    # this step's tokens, the request's num_tokens (prompt + outputs) and its
    # number of outputs so far.  The scripted model reads these.
    computed_before: dict[str, int]
    num_tokens: dict[str, int]
    num_outputs: dict[str, int]
    # Cached pages whose hash was dropped because they were reused, in order.
    evicted: list[int] = field(default_factory=list)
    # {req_id: [[first_slot, last_slot_exclusive], ...]} KV slots written this step;
    # with several KV cache groups, one such list per group.
    slots: dict[str, list] = field(default_factory=dict)
    # Waiting requests passed over and put back at the queue's head, in order.
    set_aside: list[str] = field(default_factory=list)
    # Structured output: {req_id: batch index} of the constrained requests, and the
    # bitmask rows in order as [req_id, grammar state].
    grammar_index: dict[str, int] = field(default_factory=dict)
    bitmask_rows: list[list] = field(default_factory=list)
    # Multimodal: {req_id: [item numbers encoded now]} and the content hashes the encoder
    # cache evicted since the last step, in order.
    encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    encoder_frees: list[str] = field(default_factory=list)
    # Async scheduling: per scheduled request, its output placeholders before this step
    # (tokens sampled by batches in flight); the scripted model reads these too.
    placeholders: dict[str, int] = field(default_factory=dict)


def kv_cache_header(num_blocks: int, block_size: int, num_layers: int, layer_page_bytes: int,
                    tensor_shape) -> dict:
    """The trace header of a pool sized from memory: the pages, one page over all layers
    and one token over all layers in bytes, and one layer's KV tensor shape in the
    flash-attention layout (K/V, pages, tokens per page, KV heads, head size; None for a
    block size that backend refuses)."""
    return {"num_blocks": num_blocks, "num_layers": num_layers,
            "page_size_bytes": layer_page_bytes * num_layers,
            "bytes_per_token": layer_page_bytes * num_layers // block_size,
            "tensor_shape": None if tensor_shape is None else list(tensor_shape)}


class Translated(Scheduled):
    """A :class:`Scheduled` whose containers are all its own, made for this step, and in
    the shapes the step record holds (``scheduled`` as ``[id, tokens]`` lists,
    ``finished`` sorted): the trace's step record takes them as they are, uncopied
    (:func:`harness.formats.trace.step_record`), so nothing may change them after.
    :func:`to_scheduled` and :func:`nothing_scheduled` make them."""


def translated(s: Scheduled) -> Translated:
    """``s`` in the step record's shapes: itself when :func:`to_scheduled` made it, else a
    copy (a Scheduled made by hand may hold tuples, an unsorted ``finished``, or
    containers its engine changes later)."""
    if isinstance(s, Translated):
        return s
    return Translated(
        scheduled=[[rid, n] for rid, n in s.scheduled],
        new_block_ids={rid: [list(g) for g in groups] for rid, groups in s.new_block_ids.items()},
        preempted=list(s.preempted), finished=sorted(s.finished),
        prefix_hit_tokens=dict(s.prefix_hit_tokens),
        spec_tokens={rid: list(t) for rid, t in s.spec_tokens.items()},
        computed_before=dict(s.computed_before), num_tokens=dict(s.num_tokens),
        num_outputs=dict(s.num_outputs), evicted=list(s.evicted),
        slots={rid: [list(r) for r in ranges] for rid, ranges in s.slots.items()},
        set_aside=list(s.set_aside), grammar_index=dict(s.grammar_index),
        bitmask_rows=[list(r) for r in s.bitmask_rows],
        encoder_inputs={rid: list(ids) for rid, ids in s.encoder_inputs.items()},
        encoder_frees=list(s.encoder_frees), placeholders=dict(s.placeholders))


def nothing_scheduled() -> Scheduled:
    """A step that schedules nothing (the engine idles).  (Every field given: a default
    factory each costs more than the step's record.)"""
    return Translated([], {}, [], [], {}, {}, {}, {}, {}, [], {}, [], {}, [], {}, [], {})


@dataclass
class RequestState:
    """A request's state after a step, read for the trace."""

    status: str  # WAITING, RUNNING, PREEMPTED, FINISHED_STOPPED, ...
    num_computed_tokens: int
    num_output_tokens: int
    num_output_placeholders: int = 0  # async scheduling: tokens sampled, not yet applied


class StepStates(NamedTuple):
    """The live requests' states after a step, as a step record holds them: one dict per
    field, by request id in the order asked."""

    status: dict[str, str]
    num_computed_tokens: dict[str, int]
    num_output_placeholders: dict[str, int] | None  # None: not asked for


def step_states(state: Callable[[str], RequestState], req_ids: Iterable[str],
                placeholders: bool) -> StepStates:
    """The :class:`StepStates` of ``req_ids`` read one by one with an engine's ``state``
    (an engine may instead read them itself, without a RequestState each: its own
    ``step_states(req_ids, placeholders)``); ``placeholders``: their output placeholders
    too."""
    states = {rid: state(rid) for rid in req_ids}
    return StepStates({rid: st.status for rid, st in states.items()},
                      {rid: st.num_computed_tokens for rid, st in states.items()},
                      {rid: st.num_output_placeholders for rid, st in states.items()}
                      if placeholders else None)


class Engine(Protocol):
    """One scheduler + KV cache manager, driven step by step."""

    name: str

    def start(self, stream: Stream) -> None:
        """Build a fresh scheduler and cache for this stream's config."""

    def refuses(self, stream: Stream) -> str | None:
        """Why this engine does not take a valid stream, or None when it does."""

    def version(self) -> str:
        """The vLLM version this engine is (or mirrors)."""

    def reset_prefix_cache(self) -> bool: ...

    def abort(self, req_id: str) -> None: ...

    def add(self, req: RequestSpec, arrival_index: int) -> None: ...

    def num_unfinished(self) -> int: ...

    def has_requests(self) -> bool:
        """vLLM's ``Scheduler.has_requests``: unfinished requests, or finished ones the
        worker has not been told of.  Without them ``EngineCore.step`` does nothing."""

    def schedule(self) -> Scheduled: ...

    def update(self, scheduled: Scheduled, sampled: dict[str, list[int]],
               finished_recving: list[str] = (), finished_sending: list[str] = ()) -> None:
        """Feed the scripted model's tokens back (vLLM's update_from_output), with the
        worker's KV transfer report (with kv_role)."""

    def stats(self) -> dict | None:
        """The scheduler stats the last update reported (with log_stats), as
        :func:`stats_record` writes them; None without log_stats."""

    def kv_events(self) -> list[dict]:
        """The KV cache events published during this step's schedule and update, in
        order, as :func:`kv_event_records` writes them (with kv_cache_events)."""

    def connector_calls(self) -> list[list]:
        """The calls the scheduler made to the KV connector since the last time asked, in
        order, as :class:`ConnectorScript` logs them (with kv_role)."""

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        """vLLM's update_draft_token_ids."""

    def grammar_ready(self, req_id: str) -> None:
        """The request's grammar has compiled (structured output)."""

    def state(self, req_id: str) -> RequestState: ...

    def num_free_blocks(self) -> int: ...

    def kv_cache_header(self) -> dict | None:
        """The pool start-up made of the stream's ``kv_cache_memory_bytes``, as
        :func:`kv_cache_header` writes it; None when the stream gives num_gpu_blocks."""

    def applies_oldest_now(self, in_flight: int, runs_work: bool, worker_done: bool) -> bool:
        """Async scheduling, after a step scheduled a batch (``in_flight`` counts it):
        whether EngineCore's ``step_with_batch_queue`` now waits for the oldest batch
        and applies its output (``runs_work``: the new batch schedules tokens;
        ``worker_done``: the worker has finished the oldest batch)."""

    def end_step(self) -> None:
        """The step is recorded.  An engine driven by vLLM's own loop finishes it here
        (``vllm-core``: EngineCore's ``post_step``; in an idle step the ``step`` call an
        in-process client makes, which does nothing)."""

    def shutdown(self) -> None:
        """The stream is done (vLLM's Scheduler.shutdown, as EngineCore calls it)."""


# -- the one translation into Scheduled ------------------------------------------------

NEW, RESUMED, RUNNING = "new", "resumed", "running"


class Handed(NamedTuple):
    """One request as a scheduler output hands it to the worker.

    ``block_ids`` has one list per KV cache group: the whole block table for
    a ``new`` or ``resumed`` request, only the new pages for a ``running``
    one (None when it got none).  A tuple, so that an engine may hand
    :func:`to_scheduled` plain ``(req_id, kind, block_ids, num_computed_tokens)``
    tuples: it makes one per request and step.
    """

    req_id: str
    kind: str  # NEW, RESUMED or RUNNING
    block_ids: list[list[int]] | None
    num_computed_tokens: int


@dataclass
class Observed:
    """What an engine's hooks saw during one ``schedule()`` call."""

    preempted: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)  # prefix lookups: tokens found
    evicted: list[int] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)


class WorkerTable(Protocol):
    """The worker's block table: rows of page ids, and the KV slots they give.  It copies
    the ids it is given and never changes the list (the step record holds it)."""

    def add_row(self, block_ids: list[int], row: int) -> None: ...

    def append_row(self, block_ids: list[int], row: int) -> None: ...

    def slots(self, row: int, first_position: int, num_tokens: int) -> list[int]: ...

    # A table may also have ``slot_runs(row, first_position, num_tokens)``: the same slots
    # as [start, end) runs, what :func:`slot_ranges` makes of them, worked out a page at a
    # time (:func:`slot_runs`); the engines' own tables have it.


def to_scheduled(handed: Iterable[Handed], num_scheduled_tokens: Iterable[tuple[str, int]],
                 spec_tokens: dict[str, list[int]], finished: Iterable[str],
                 computed_before: dict[str, int], observed: Observed,
                 workers: list[WorkerTable], rows: dict[str, int],
                 sizes: Callable[[str], tuple[int, int]],
                 grammar_index: dict[str, int] | None = None,
                 bitmask_rows: Iterable[tuple[str, int]] = (),
                 encoder_inputs: dict[str, list[int]] | None = None,
                 encoder_frees: Iterable[str] = (),
                 placeholders_before: dict[str, int] | None = None) -> Scheduled:
    """One step in engine-neutral form: a :class:`Translated`, each value copied once out
    of what the engine handed over.

    ``computed_before`` is every request's ``num_computed_tokens`` before the
    step; a handed request's own count replaces it.  ``sizes(req_id)`` gives
    its ``(num_tokens, num_output_tokens)``.  ``workers`` holds one worker
    table per KV cache group; each is fed its group's pages in the order the
    output lists them, as vLLM's model runner does.  ``grammar_index`` and
    ``bitmask_rows`` are the output's structured-output part, ``encoder_inputs`` and
    ``encoder_frees`` its multimodal part.  ``placeholders_before``: every request's
    output placeholders before the step (async scheduling; only positive ones are kept).
    """
    handed_counts, new_block_ids, admitted = hand_to_workers(handed, workers, rows)
    scheduled: list[list] = []
    before: dict[str, int] = {}
    num_tokens: dict[str, int] = {}
    num_outputs: dict[str, int] = {}
    slots: dict[str, list] = {}
    for rid, n in num_scheduled_tokens:
        scheduled.append([rid, n])
        first = before[rid] = handed_counts[rid] if rid in handed_counts else computed_before[rid]
        num_tokens[rid], num_outputs[rid] = sizes(rid)
        slots[rid] = written_slots(workers, rows[rid], first, n)
    hits = observed.hits
    return Translated(  # in field order; a feature's part is made only when there is one
        scheduled, new_block_ids, list(observed.preempted), sorted(finished),
        {rid: hits[rid] for rid in admitted if rid in hits} if hits else {},
        {rid: list(t) for rid, t in spec_tokens.items()} if spec_tokens else {},
        before, num_tokens, num_outputs, list(observed.evicted), slots,
        list(observed.set_aside), dict(grammar_index) if grammar_index else {},
        [[rid, state] for rid, state in bitmask_rows] if bitmask_rows else [],
        {rid: list(ids) for rid, ids in encoder_inputs.items()} if encoder_inputs else {},
        list(encoder_frees) if encoder_frees else [],
        placeholders(scheduled, placeholders_before) if placeholders_before else {})


def counts_before(requests: dict) -> tuple[dict[str, int], dict[str, int]]:
    """What :func:`to_scheduled` is given of the scheduler's requests (vLLM's or the
    reference's ``Request``, by id) before a ``schedule()`` call: each one's
    ``num_computed_tokens``, and its ``num_output_placeholders`` where it holds any (only
    under async scheduling)."""
    before: dict[str, int] = {}
    pending: dict[str, int] = {}
    for rid, r in requests.items():
        before[rid] = r.num_computed_tokens
        if r.num_output_placeholders:
            pending[rid] = r.num_output_placeholders
    return before, pending


def placeholders(scheduled: list[list], before: dict[str, int]) -> dict[str, int]:
    """The scheduled requests' positive output placeholders before the step."""
    return {rid: before[rid] for rid, _ in scheduled if before.get(rid, 0)}


def hand_to_workers(handed: Iterable[Handed], workers: list[WorkerTable],
                    rows: dict[str, int]) -> tuple[dict[str, int], dict[str, list], list[str]]:
    """Feed each worker table its group's pages of every handed request (a new or resumed
    one's whole table as its row, a running one's new pages appended), as vLLM's model
    runner does; the handed requests' own computed counts, their pages as copied for the
    record, and the requests admitted (new or resumed), in order."""
    handed_counts: dict[str, int] = {}
    new_block_ids: dict[str, list[list[int]]] = {}
    admitted: list[str] = []
    for rid, kind, block_ids, num_computed_tokens in handed:
        handed_counts[rid] = num_computed_tokens
        groups = None if block_ids is None else list(map(list, block_ids))
        if groups is not None:
            new_block_ids[rid] = groups
        row = rows[rid]
        if kind == RUNNING:
            if groups is not None:
                for worker, group in zip(workers, groups):
                    worker.append_row(group, row)
            continue
        admitted.append(rid)
        for g, worker in enumerate(workers):
            worker.add_row(groups[g] if groups else [], row)
    return handed_counts, new_block_ids, admitted


def written_slots(workers: list[WorkerTable], row: int, first_position: int,
                  num_tokens: int) -> list:
    """The slot runs of one request's new tokens: one list of runs, or one per group."""
    if len(workers) == 1:
        return table_slot_runs(workers[0], row, first_position, num_tokens)
    return [table_slot_runs(w, row, first_position, num_tokens) for w in workers]


def table_slot_runs(worker: WorkerTable, row: int, first_position: int,
                    num_tokens: int) -> list[list[int]]:
    """The slot runs of one worker table: its own ``slot_runs`` where it has one, else
    :func:`slot_ranges` of its slots one by one."""
    runs = getattr(worker, "slot_runs", None)
    if runs is not None:
        return runs(row, first_position, num_tokens)
    return slot_ranges(worker.slots(row, first_position, num_tokens))


def page_span(first_position: int, num_tokens: int, block_size: int) -> slice:
    """The pages of a block-table row that ``num_tokens`` (> 0) positions from
    ``first_position`` on fall in."""
    return slice(first_position // block_size,
                 (first_position + num_tokens - 1) // block_size + 1)


def slot_runs(pages: list[int], block_size: int, first_position: int,
              num_tokens: int) -> list[list[int]]:
    """The block-table rule (slot = page * block_size + position % block_size) for
    ``num_tokens`` positions from ``first_position`` on, as [start, end) runs of
    consecutive slots: :func:`slot_ranges` of the slots one by one, worked out a page at
    a time.  ``pages``: the row's :func:`page_span` of them, as ints; a span cut short
    by the row's end raises IndexError, as reading a position past the row does."""
    if num_tokens <= 0:
        return []
    end = first_position + num_tokens
    first_page = first_position // block_size
    if len(pages) <= (end - 1) // block_size - first_page:
        raise IndexError(f"position {end - 1} is past the block table's row")
    return page_runs(lambda p: pages[p // block_size - first_page] * block_size
                     + p % block_size, block_size, first_position, num_tokens)


def page_runs(first_slot_of: Callable[[int], int], block_size: int, first_position: int,
              num_tokens: int) -> list[list[int]]:
    """The slots of ``num_tokens`` positions from ``first_position`` on as [start, end)
    runs: each page's run starts at ``first_slot_of`` its first position and takes one
    slot per position to the page's end; runs that touch are one."""
    end = first_position + num_tokens
    runs: list[list[int]] = []
    position = first_position
    while position < end:
        page_end = min(end, position - position % block_size + block_size)
        first = first_slot_of(position)
        if runs and runs[-1][1] == first:
            runs[-1][1] = first + page_end - position
        else:
            runs.append([first, first + page_end - position])
        position = page_end
    return runs


def slot_ranges(slots: list[int]) -> list[list[int]]:
    """Compress slot ids into [start, end) runs of consecutive slots."""
    if not slots:
        return []
    ranges: list[list[int]] = []
    start = end = slots[0]
    for slot in slots:
        if slot != end:
            ranges.append([start, end])
            start = slot
        end = slot + 1
    ranges.append([start, end])
    return ranges


PREFIX_CACHE_FIELDS = ("reset", "requests", "queries", "hits")
#: From 0.11.1 (prefix_stats_split_preempted): the lookups of preempted requests, apart.
PREEMPTED_PREFIX_CACHE_FIELDS = ("preempted_requests", "preempted_queries", "preempted_hits")
SPEC_DECODING_FIELDS = ("num_spec_tokens", "num_drafts", "num_draft_tokens",
                        "num_accepted_tokens", "num_accepted_tokens_per_pos")


def stats_record(num_running: int, num_waiting: int, kv_cache_usage: float,
                 prefix_cache, spec_decoding, preempted_apart: bool,
                 num_set_aside: int | None = None) -> dict:
    """One step's scheduler stats (vLLM's SchedulerStats) as a trace writes them.

    ``prefix_cache`` and ``spec_decoding`` are vLLM's PrefixCacheStats and
    SpecDecodingStats or the reference's (same field names); ``spec_decoding`` is
    None when no drafts were checked this step.  ``preempted_apart``: the release
    counts preempted requests' lookups apart (their three fields are written).
    ``num_set_aside``: the release counts the set-aside queue apart from the waiting one
    (0.20.0 and later, ``num_skipped_waiting_reqs``; written only then).
    """
    fields = PREFIX_CACHE_FIELDS + (PREEMPTED_PREFIX_CACHE_FIELDS if preempted_apart else ())
    return {"num_running_reqs": num_running, "num_waiting_reqs": num_waiting,
            "kv_cache_usage": kv_cache_usage,
            "prefix_cache": {f: getattr(prefix_cache, f) for f in fields},
            "spec_decoding": None if spec_decoding is None else
            {f: _plain(getattr(spec_decoding, f)) for f in SPEC_DECODING_FIELDS},
            **({} if num_set_aside is None else {"num_skipped_waiting_reqs": num_set_aside})}


def _plain(value):
    return list(value) if isinstance(value, list) else value


# -- KV cache events ---------------------------------------------------------------------

class HashNumbers:
    """Block hashes numbered 0, 1, 2, ... in the order a trace first shows them.

    vLLM's hashes are random per process (their chain starts from a random
    seed) and the reference's are its own: only which events name the same
    hash can be compared, and the numbering keeps exactly that.
    """

    def __init__(self) -> None:
        self.numbers: dict[object, int] = {}

    def __call__(self, block_hash) -> int | None:
        if block_hash is None:
            return None
        return self.numbers.setdefault(block_hash, len(self.numbers))


def kv_event_records(batches, number: HashNumbers) -> list[dict]:
    """The events of the batches published in one step, in order, as a trace writes them.

    An event is vLLM's (``vllm.distributed.kv_events``) or the reference's
    (``reference.kv_events``): the same class names and fields.
    """
    return [kv_event_record(event, number) for batch in batches for event in batch]


def kv_event_record(event, number: HashNumbers) -> dict:
    kind = type(event).__name__
    if kind == "BlockStored":
        return {"type": kind, "block_hashes": [number(h) for h in event.block_hashes],
                "parent_block_hash": number(event.parent_block_hash),
                "token_ids": list(event.token_ids), "block_size": event.block_size,
                "lora_id": event.lora_id, "medium": event.medium}
    if kind == "BlockRemoved":
        return {"type": kind, "block_hashes": [number(h) for h in event.block_hashes],
                "medium": event.medium}
    if kind == "AllBlocksCleared":
        return {"type": kind}
    raise ValueError(f"unknown KV cache event {kind}")


# -- the scripted KV connector -----------------------------------------------------------

class ConnectorScript:
    """The scripted KV connector's answers, one instance per engine run: both engines'
    connectors ask it, so they answer alike (a request's ``kv_transfer`` says what).

    * lookups: "cannot tell yet" (None) for the first ``unknown_lookups`` calls; then
      the ``external_tokens`` past the local hit, at most all but the request's last
      token (all of them when the load is asynchronous), asynchronous if the script
      says so and there is anything to load;
    * a finished request's pages are kept (to send them) when it has ``send_steps``.

    Every call is logged as a list: ``["lookup", id, num_local_hit, tokens, async]``,
    ``["alloc", id, block_ids, num_external_tokens]``, ``["finished", id, block_ids,
    keeps_pages]``.
    """

    def __init__(self, stream: Stream) -> None:
        self.transfers = {r.id: r.kv_transfer for r in stream.requests}
        self.num_lookups: dict[str, int] = {}
        self.calls: list[list] = []

    def matched_tokens(self, req_id: str, num_tokens: int,
                       num_local_hit: int) -> tuple[int | None, bool]:
        t = self.transfers.get(req_id)
        asked = self.num_lookups.get(req_id, 0)
        self.num_lookups[req_id] = asked + 1
        if t is None:
            answer: tuple[int | None, bool] = (0, False)
        elif asked < t.unknown_lookups:
            answer = (None, False)
        else:
            offered = min(t.external_tokens, num_tokens if t.load_async else num_tokens - 1)
            n = max(0, offered - num_local_hit)
            answer = (n, t.load_async and n > 0)
        self.calls.append(["lookup", req_id, num_local_hit, answer[0], answer[1]])
        return answer

    def allocated(self, req_id: str, block_ids: list[int], num_external: int) -> None:
        self.calls.append(["alloc", req_id, list(block_ids), num_external])

    def finished(self, req_id: str, block_ids: list[int]) -> bool:
        t = self.transfers.get(req_id)
        keeps = t is not None and t.send_steps is not None
        self.calls.append(["finished", req_id, list(block_ids), keeps])
        return keeps

    def take_calls(self) -> list[list]:
        calls, self.calls = self.calls, []
        return calls


class TransferReports:
    """The worker side of the scripted connector: when it reports loads and sends done.

    A load that starts in step ``s`` (an ``alloc`` with external tokens of a request
    whose load is asynchronous) is reported in step ``s + load_steps``'s output; the
    pages a finished request keeps, in step ``f + send_steps``'s output, ``f`` being
    the step in which the connector was told of the finish.
    """

    def __init__(self, stream: Stream) -> None:
        self.transfers = {r.id: r.kv_transfer for r in stream.requests}
        self.recving: dict[int, list[str]] = {}
        self.sending: dict[int, list[str]] = {}

    def note(self, step: int, calls: list[list]) -> None:
        for call in calls:
            t = self.transfers.get(call[1])
            if t is None:
                continue
            if call[0] == "alloc" and call[3] > 0 and t.load_async:
                self.recving.setdefault(step + t.load_steps, []).append(call[1])
            elif call[0] == "finished" and call[3]:
                self.sending.setdefault(step + t.send_steps, []).append(call[1])

    def due(self, step: int) -> tuple[list[str], list[str]]:
        """(finished_recving, finished_sending) of this step's output: the transfers done
        by this step and not reported yet (one done while the engine idled is reported
        by the next step that runs the model), each sorted: vLLM's worker reports sets,
        whose order the scheduler's frees follow (see the vLLM engine's ``update``); the
        harness fixes it."""
        return _take_due(self.recving, step), _take_due(self.sending, step)


def _take_due(by_step: dict[int, list[str]], step: int) -> list[str]:
    due = [s for s in by_step if s <= step]
    return sorted(rid for s in due for rid in by_step.pop(s))
