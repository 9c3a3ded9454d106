"""A bare reference scheduler loop: the other half of the benchmark's yardstick.

The reference's ``Scheduler`` built as :mod:`harness.engines.reference_engine` builds it,
driven through one stream with nothing the harness adds: no event recorder, no worker
block table, no trace.  Each step is ``schedule()``, the stream's scripted tokens,
``update_from_output()`` and, with speculative decoding, the scripted drafts; arrivals,
aborts and prefix-cache resets come at the stream's steps, as in
:mod:`harness.engines.vllm_bare`, whose streams it takes (:func:`refuses`).
"""

from __future__ import annotations


from harness.engines.reference_engine import ReferenceEngine
from harness.formats.scripted_model import accepted_prefix
from harness.formats.stream import Stream, timeline
from reference.request import RequestStatus
from reference.scheduler import Scheduler


#: One reference engine per release (it works out the release's rules when built).
_ENGINES: dict[str, ReferenceEngine] = {}


def refuses(stream: Stream) -> str | None:
    """Why the bare loops (this one and vLLM's) do not run ``stream``, or None: a plain
    synchronous serving loop runs no async scheduling, pipeline stages, KV connector or
    structured output."""
    c = stream.config
    if c.async_scheduling:
        return "async scheduling"
    if c.pipeline_parallel_size > 1:
        return "pipeline stages"
    if c.kv_role is not None:
        return "a KV connector"
    if any(r.structured_output is not None for r in stream.requests):
        return "structured output"
    return None


def run_bare(stream: Stream, release: str = "0.11.0",
             record: list | None = None) -> int:
    """Drive the reference's scheduler through ``stream`` until nothing is left or it
    raises (a vLLM crash the reference reproduces); the steps it took.  ``record`` gets
    each step's ``(request, tokens)`` in order (an idle step: empty)."""
    why = refuses(stream)
    if why is not None:
        raise ValueError(f"the bare loop does not take streams with {why}")
    steps = [0]
    try:
        _loop(stream, release, record, steps)
    except Exception:  # noqa: BLE001 -- the step loop records such a run as a failure
        pass
    return steps[0]


def _loop(stream: Stream, release: str, record: list | None, steps: list[int]) -> None:
    engine = _ENGINES.get(release) or _ENGINES.setdefault(release, ReferenceEngine(release))
    engine.start(stream)
    sched = engine.sched = Scheduler(engine.config)  # no recorder: nothing observed
    script = {r.id: r for r in stream.requests}
    drafts_left = {r.id: list(r.drafts) for r in stream.requests}
    times = timeline(stream)
    arrivals, aborts, resets, last_arrival = (times.arrivals, times.aborts, times.resets,
                                              times.last_arrival)
    requests = engine.requests
    step = 0
    while step < stream.config.max_steps:
        steps[0] = step
        if step in resets:
            sched.reset_prefix_cache()
        for r in aborts.get(step, ()):
            sched.finish_requests([r.id], RequestStatus.FINISHED_ABORTED)
        for index, spec in arrivals.get(step, ()):
            engine.add(spec, index)
        if sched.num_unfinished() == 0 and step >= last_arrival:
            break
        if not sched.has_requests():
            if record is not None:
                record.append([])
            step += 1
            continue
        # What each request has computed before this step's tokens, as the worker is told
        # it (a request granted tokens and then preempted keeps its count from before).
        before = {r.request_id: r.num_computed_tokens for r in sched.running}
        out = sched.schedule()
        before.update((d.req_id, d.num_computed_tokens)
                      for d in (*out.scheduled_new_reqs, *out.scheduled_cached_reqs))
        if record is not None:
            record.append(list(out.num_scheduled_tokens.items()))
        sampled: dict[str, list[int]] = {}
        for rid, n in out.num_scheduled_tokens.items():
            r = requests[rid]
            if before[rid] + n < r.num_tokens:
                continue  # a partial prefill emits nothing
            done = r.num_output_tokens
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            truth = script[rid].output
            a = accepted_prefix(drafts, truth[done:done + len(drafts)])
            sampled[rid] = list(truth[done:done + a + 1])
        sched.update_from_output(out, sampled)
        if stream.config.num_speculative_tokens:
            drafts = {}
            for rid in out.num_scheduled_tokens:
                queue = drafts_left[rid]
                drafts[rid] = list(queue.pop(0)) if rid in sampled and queue else []
            if drafts:
                sched.update_draft_token_ids(drafts)
        step += 1
    steps[0] = step
