"""A bare vLLM scheduler loop: the benchmark's yardstick for what checking a stream costs.

vLLM's ``Scheduler`` built the way :mod:`harness.engines.vllm_adapter` builds it, driven
through one stream with nothing the harness adds: no hooks, no worker block table, no
trace, no second engine.  Each step is ``schedule()``, a ``ModelRunnerOutput`` carrying
the stream's scripted tokens, ``update_from_output()`` and, with speculative decoding,
the scripted drafts; arrivals, aborts and prefix-cache resets come at the stream's steps,
as in :mod:`harness.loop.runner`.

It takes the streams a plain synchronous serving loop could run: not async scheduling,
pipeline stages, a KV connector or structured output (:func:`refuses` says why).
"""

from __future__ import annotations

import dataclasses

from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from harness.engines import vllm_compat as compat
from harness.engines.reference_bare import refuses  # the same streams, both bare loops
from harness.engines.vllm_adapter import (POOLED, build_scheduler, mm_features,
                                          pages_from_memory, pooling_params, sampling_params)
from harness.formats.scripted_model import accepted_prefix
from harness.formats.stream import Stream, largest_mm_item, lora_ids, timeline


@dataclasses.dataclass
class BareRun:
    """What the bare loop did: its steps, with ``record`` the ``(request, tokens)`` each
    step scheduled in vLLM's order (an idle step is empty), and the exception vLLM raised,
    if any (the step loop records such a run as an engine failure)."""

    steps: int
    scheduled: list[list[tuple[str, int]]]
    failure: str | None = None


def run_bare(stream: Stream, record: bool = False) -> BareRun:
    """Drive vLLM's scheduler through ``stream`` until nothing is left or it raises."""
    why = refuses(stream)
    if why is not None:
        raise ValueError(f"the bare loop does not take streams with {why}")
    run = BareRun(0, [])
    try:
        _loop(stream, record, run)
    except Exception as exc:  # vLLM raised (an assertion inside its scheduler)
        run.failure = f"{type(exc).__name__}: {exc}"
    return run


def _loop(stream: Stream, record: bool, run: BareRun) -> None:
    from vllm.lora.request import LoRARequest

    c = stream.config
    if c.kv_cache_memory_bytes is not None:
        c = dataclasses.replace(c, num_gpu_blocks=pages_from_memory(c))
    sched = build_scheduler(c, largest_mm_item(stream))
    hasher = None
    if c.enable_prefix_caching:
        hash_fn = compat.hash_fn(sched.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = compat.request_block_hasher(c.block_size, hash_fn, sched.vllm_config)
    adapters = lora_ids(stream)
    pooling = any(r.pooling for r in stream.requests)
    script = {r.id: r for r in stream.requests}
    drafts_left = {r.id: list(r.drafts) for r in stream.requests}
    times = timeline(stream)
    arrivals, aborts, resets, last_arrival = (times.arrivals, times.aborts, times.resets,
                                              times.last_arrival)
    requests: dict[str, Request] = {}
    steps = run.scheduled

    step = 0
    while True:
        run.steps = step
        if step in resets:
            sched.reset_prefix_cache()
        for r in aborts.get(step, ()):
            sched.finish_requests(r.id, RequestStatus.FINISHED_ABORTED)
        for index, spec in arrivals.get(step, ()):
            params = sampling_params(spec)
            lora = None if spec.lora is None else LoRARequest(
                lora_name=spec.lora, lora_int_id=adapters[spec.lora],
                lora_path=f"/nonexistent/lora/{spec.lora}")
            req = Request(
                request_id=spec.id, prompt_token_ids=list(spec.prompt), sampling_params=params,
                pooling_params=pooling_params(spec),
                **compat.request_eos_kwargs(params, spec.eos_token_id),
                arrival_time=float(index), cache_salt=spec.cache_salt, priority=spec.priority,
                lora_request=lora, block_hasher=hasher, mm_features=mm_features(spec))
            requests[spec.id] = req
            sched.add_request(req)
        if sched.get_num_unfinished_requests() == 0 and step >= last_arrival:
            break
        if step >= c.max_steps:
            break
        if not sched.has_requests():
            if record:
                steps.append([])
            step += 1
            continue

        # What each request has computed before this step's tokens, as the worker is told
        # it; a running request that schedule() grants tokens and then preempts to make
        # room is in no list handed to the worker: its count from before the call.
        before = {r.request_id: r.num_computed_tokens for r in sched.running}
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        before.update((d.req_id, d.num_computed_tokens) for d in out.scheduled_new_reqs)
        cached = out.scheduled_cached_reqs
        before.update(zip(cached.req_ids, cached.num_computed_tokens))
        emitted: dict[str, list[int]] = {}
        for rid, n in out.num_scheduled_tokens.items():
            r = requests[rid]
            if before[rid] + n < r.num_tokens:
                continue  # a partial prefill emits nothing
            done = r.num_output_tokens
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            truth = script[rid].output
            a = accepted_prefix(drafts, truth[done:done + len(drafts)])
            emitted[rid] = list(truth[done:done + a + 1])
        if pooling:
            tokens, pooled = [], [POOLED if rid in emitted else None for rid in ids]
        else:
            tokens = compat.sampled_token_ids([emitted.get(rid, []) for rid in ids])
            pooled = []
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, **compat.runner_output_kwargs(ids),
            sampled_token_ids=tokens, logprobs=None, prompt_logprobs_dict={},
            pooler_output=pooled))
        if c.num_speculative_tokens:
            drafts = {}
            for rid in ids:
                queue = drafts_left[rid]
                drafts[rid] = list(queue.pop(0)) if rid in emitted and queue else []
            if drafts:
                sched.update_draft_token_ids(DraftTokenIds(
                    req_ids=list(drafts), draft_token_ids=list(drafts.values())))
        if record:
            steps.append(list(out.num_scheduled_tokens.items()))
        step += 1
    sched.shutdown()
