"""The step loop: drives one engine through one stream and records its trace.

At step k: (0) reset the prefix cache if k is listed; (1) abort the requests
whose ``abort_step == k``; (2) add the requests whose ``arrival_step == k``;
(3) stop if nothing is unfinished and no arrival is pending, else schedule;
(4) the scripted model emits; (5) ``update_from_output``; (6) with speculative
decoding on, every scheduled request gets a draft list: its next scripted one
if it emitted tokens, an empty one if not.

With ``async_scheduling`` or ``pipeline_parallel_size`` > 1 a step is one call
of vLLM's ``EngineCore.step_with_batch_queue`` instead (:func:`_batch_queue_step`):
the scripted model answers a batch when it is scheduled, and the answer is
applied once the queue is full or a step schedules no work, unless the stream
lists the step in ``async_ready_steps`` (the worker was done at once).
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

from harness.formats import counterexamples, scripted_model
from harness.formats.steps import Engine, TransferReports, nothing_scheduled, step_states
from harness.formats.paths import write_atomic
from harness.formats.stream import Stream, timeline
from harness.formats.trace import ENGINE_FAILURE, Trace, optional_fields, step_record


@dataclass(frozen=True)
class Limits:
    """How long one engine may take on one stream, and how much memory the process may hold.

    The stream bounds (``harness/formats/schemas/stream.schema.json``) keep every valid
    stream well inside these; they stop an engine that hangs or runs away, as
    that engine's failure on that stream.
    """

    seconds: float = field(default_factory=lambda: float(os.environ.get("HARNESS_STREAM_SECONDS", 600)))
    rss_bytes: int = field(default_factory=lambda: int(os.environ.get("HARNESS_STREAM_RSS_BYTES", 16 << 30)))
    rss_every: int = 64  # steps between two looks at the resident memory (none at step 0)


class LimitExceeded(Exception):
    pass


#: The verdict of a run stopped at its first difference from the trace it was held to.
UNLIKE = "unlike"


class _Unlike(Exception):
    """The run under way has left the trace it is held to (see :func:`run`'s ``like``)."""


def resident_bytes() -> int:
    """The process's resident memory now (Linux), or its peak elsewhere."""
    try:
        return int(os.pread(_statm(), 64, 0).split()[1]) * _PAGE_BYTES[0]
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


#: This process's ``/proc/self/statm``, kept open (opening it costs more than reading
#: it, twice a stream): ``(pid, descriptor, inode)``; a forked worker opens its own, and
#: a descriptor closed behind the harness's back is opened again.
_STATM: list[tuple[int, int, int]] = []
_PAGE_BYTES: list[int] = []


def _statm() -> int:
    pid = os.getpid()
    if _STATM and _STATM[0][0] == pid:
        fd, inode = _STATM[0][1:]
        try:
            if os.fstat(fd).st_ino == inode:
                return fd
        except OSError:
            pass
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    _STATM[:] = [(pid, fd, os.fstat(fd).st_ino)]
    _PAGE_BYTES[:] = [os.sysconf("SC_PAGE_SIZE")]
    return fd


def run(engine: Engine, stream: Stream, limits: Limits | None = None,
        like: Trace | None = None) -> Trace:
    """Run ``stream`` through ``engine``; engine exceptions end the trace with a failure.

    ``like``: a trace of the same stream to hold the run to; the run stops at the first
    header or step record that differs from it (verdict :data:`UNLIKE`), since the
    rule report only asks whether a mutant changes the trace, not how.
    """
    trace = Trace(engine=engine.name, vllm_version=engine.version(), stream=stream)
    try:
        engine.start(stream)
        trace.kv_cache = engine.kv_cache_header()
        if like is not None and trace.kv_cache != like.kv_cache:
            raise _Unlike
        _loop(engine, stream, trace, limits or Limits(), like)
        engine.shutdown()
    except _Unlike:
        trace.fail(len(trace.steps), "left the trace it was held to", verdict=UNLIKE)
    except LimitExceeded as exc:
        trace.fail(len(trace.steps), str(exc))
    except Exception as exc:  # an assertion or error inside the engine
        step = len(trace.steps)
        trace.fail(step, f"{type(exc).__name__}: {exc} ({raise_site(exc)})")
    return trace


def raise_site(exc: BaseException) -> str:
    """``file.py:line`` of the line that raised ``exc`` (its traceback's innermost frame),
    read off the traceback (``traceback.extract_tb`` also reads every frame's source
    line: 3% of the benchmark's checks)."""
    tb = exc.__traceback__  # a caught exception always has one
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


def _check_limits(step: int, started: float, limits: Limits) -> None:
    if time.monotonic() - started > limits.seconds:
        raise LimitExceeded(f"wall-clock limit: {limits.seconds:g} s spent before step {step}")
    # Not at step 0: a stream that runs away does so over many steps, and most streams
    # are done in fewer than rss_every, so that look was most of what the limit cost.
    if step % limits.rss_every == 0 and step and resident_bytes() > limits.rss_bytes:
        raise LimitExceeded(f"memory limit: more than {limits.rss_bytes >> 20} MiB resident "
                            f"before step {step}")


def _loop(engine: Engine, stream: Stream, trace: Trace, limits: Limits,
          like: Trace | None = None) -> None:
    started = time.monotonic()
    by_id = {r.id: r for r in stream.requests}
    times = timeline(stream)
    arrivals, aborts, resets, last_arrival = (times.arrivals, times.aborts, times.resets,
                                              times.last_arrival)
    grammars: dict[int, list] = defaultdict(list)
    for r in stream.requests:
        if r.structured_output is not None:
            grammars[r.structured_output.ready_step].append(r)
    optional = optional_fields(stream)
    # The worker side of a scripted KV connector (stream config kv_role).
    reports = TransferReports(stream) if stream.config.kv_role is not None else None
    drafts_left = {r.id: list(r.drafts) for r in stream.requests}
    # The requests that have arrived and have not been shown finished, in arrival order.
    live: list[str] = []
    # A batch queue (async scheduling, pipeline parallelism): the batches scheduled whose
    # output is not applied yet, newest first.
    batch_queue = stream.config.batch_queue
    in_flight: deque[Batch] = deque()
    read_states = states_reader(engine, "output_placeholders" in optional)

    step = 0
    while True:
        _check_limits(step, started, limits)
        reset = engine.reset_prefix_cache() if step in resets else None
        for r in aborts.get(step, ()):
            engine.abort(r.id)
        for index, r in arrivals.get(step, ()):
            engine.add(r, index)
            live.append(r.id)
        for r in grammars.get(step, ()):
            if r.abort_step is None or r.abort_step > step:
                engine.grammar_ready(r.id)
        if engine.num_unfinished() == 0 and step >= last_arrival and not in_flight:
            trace.complete()
            return
        if step >= stream.config.max_steps:
            trace.fail(step, f"max_steps ({stream.config.max_steps}) reached with "
                             f"{engine.num_unfinished()} request(s) unfinished", verdict="max_steps")
            return

        updated = None
        if batch_queue and (engine.has_requests() or in_flight):
            scheduled, applied = _batch_queue_step(engine, stream, step, by_id, in_flight)
            emitted = applied.sampled if applied else {}
            updated = applied.step if applied else None
            stats = engine.stats() if applied and "stats" in optional else None
            kv_events = engine.kv_events() if "kv_events" in optional else None
            kv_connector = None
        elif engine.has_requests():
            scheduled, emitted, stats, kv_events, kv_connector = _step(
                engine, stream, step, by_id, optional, reports, drafts_left)
        else:
            # vLLM's engine idles: EngineCore.step neither schedules nor updates, so
            # nothing is published or reported until a step runs again.
            scheduled, emitted, stats = nothing_scheduled(), {}, None
            kv_events = [] if "kv_events" in optional else None
            kv_connector = ({"calls": [], "finished_recving": [], "finished_sending": []}
                            if reports else None)

        states = read_states(live)
        live = [req_id for req_id, status in states.status.items()
                if not status.startswith("FINISHED")]
        trace.steps.append(step_record(step, scheduled, emitted, states,
                                       engine.num_free_blocks(), reset, optional,
                                       stats, kv_events, kv_connector, updated))
        if like is not None and not _same_step(trace, like):
            raise _Unlike
        engine.end_step()
        step += 1


def states_reader(engine: Engine, placeholders: bool):
    """How the live requests' states are read after each step: by the engine's own
    ``step_states`` where the class whose ``state`` it has made one too, else one
    ``state`` call each (:func:`harness.formats.steps.step_states`; so a subclass that
    changes ``state`` alone is read through it); ``placeholders``: with their output
    placeholders."""
    for cls in type(engine).__mro__:
        if "state" in vars(cls):
            if "step_states" in vars(cls):
                return lambda req_ids: engine.step_states(req_ids, placeholders)
            break
    return lambda req_ids: step_states(engine.state, req_ids, placeholders)


def _same_step(trace: Trace, like: Trace) -> bool:
    """The step just recorded is the one ``like`` recorded at that point."""
    i = len(trace.steps) - 1
    return i < len(like.steps) and trace.steps[i] == like.steps[i]


@dataclass
class Batch:
    """A scheduled batch and the scripted model's answer to it, not applied yet."""

    step: int
    scheduled: object  # Scheduled
    sampled: dict[str, list[int]]


def _batch_queue_step(engine: Engine, stream: Stream, step: int, by_id: dict,
                in_flight: deque[Batch]) -> tuple:
    """One step of vLLM's engine with a batch queue (``step_with_batch_queue``):
    schedule a batch if any request is there, then apply the oldest batch in flight
    when the engine says it waits for it (:meth:`Engine.applies_oldest_now`).  Returns
    the batch scheduled now (or nothing) and the batch applied (or None)."""
    scheduled = nothing_scheduled()
    if engine.has_requests():
        scheduled = engine.schedule()
        in_flight.appendleft(Batch(step, scheduled, scripted_model.sample(scheduled, by_id)))
        # The worker is done with a batch at once when its step is listed (the Future
        # stays pending otherwise until waited for); EngineCore looks at the oldest.
        worker_done = in_flight[-1].step in stream.config.async_ready_steps
        if not engine.applies_oldest_now(len(in_flight), bool(scheduled.scheduled),
                                         worker_done):
            return scheduled, None
    applied = in_flight.pop()
    engine.update(applied.scheduled, applied.sampled)
    return scheduled, applied


def _step(engine: Engine, stream: Stream, step: int, by_id: dict, optional: frozenset[str],
          reports: TransferReports | None, drafts_left: dict[str, list]):
    """One step of vLLM's engine: schedule, the scripted scripted_model, update, drafts."""
    scheduled = engine.schedule()
    calls = engine.connector_calls() if reports else []
    if reports:
        reports.note(step, calls)
    emitted = scripted_model.sample(scheduled, by_id)
    recving, sending = reports.due(step) if reports else ([], [])
    engine.update(scheduled, emitted, recving, sending)
    stats = engine.stats() if "stats" in optional else None
    kv_events = engine.kv_events() if "kv_events" in optional else None
    kv_connector = None
    if reports:
        finished = engine.connector_calls()  # requests that finished in the update
        reports.note(step, finished)
        kv_connector = {"calls": calls + finished, "finished_recving": recving,
                        "finished_sending": sending}
    if stream.speculative:
        # Like vLLM's model runner, the proposer answers for every request in
        # the batch: one that emitted gets its next scripted draft list, one
        # that emitted nothing (a partial prefill) an empty list.
        drafts = {}
        for req_id, _ in scheduled.scheduled:
            queue = drafts_left[req_id]
            drafts[req_id] = list(queue.pop(0)) if req_id in emitted and queue else []
        if drafts:
            engine.set_drafts(drafts)
    return scheduled, emitted, stats, kv_events, kv_connector


def trace_streams(engine: Engine, streams: list[Stream], output: Path | None) -> int:
    """The ``trace`` command: each stream's trace to ``output/<name>.json``, or JSON Lines
    on stdout; 0, or 1 when the engine failed on a stream (kept for replay)."""
    status = 0
    for stream in streams:
        trace = run(engine, stream)
        if trace.failure and trace.verdict == ENGINE_FAILURE:
            saved = counterexamples.save(stream, counterexamples.unique_label(
                stream, f"{engine.name}-failure"))
            print(f"{stream.name}: {engine.name} failed at step {trace.failure['step']}: "
                  f"{trace.failure['message']} (stream saved to {saved})", file=sys.stderr)
            status = 1
        if output is not None:
            write_atomic(output / f"{stream.name}.json", trace.dumps() + "\n")
        else:
            sys.stdout.write(trace.dumps() + "\n")
    return status
