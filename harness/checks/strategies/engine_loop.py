"""Streams for the engine loop around the scheduler: KV connectors (idle and sending),
async scheduling's batch queue and pipeline stages."""

from __future__ import annotations

from typing import Any

from hypothesis.strategies import SearchStrategy

from harness.checks.strategies.configs import configs
from harness.checks.strategies.draws import (
    DEFAULT_VOCAB_SIZE,
    _add_follow_up,
    _align_model_len,
    _cdiv,
    _draw_ready_steps,
    _likely_steps,
    _one_in,
    _rarely,
    _tokens,
    _with,
    _without_drafts_and_transfers,
    st,
)
from harness.checks.strategies.inputs import (
    encoder_pressure_streams,
    grammar_streams,
    lora_streams,
    mm_streams,
    pooling_streams,
)
from harness.checks.strategies.kv_groups import hybrid_streams
from harness.checks.strategies.scheduling import (
    chunked_prefill_streams,
    crowd_streams,
    preemption_streams,
    prefix_cache_streams,
    set_aside_streams,
    stop_and_abort_streams,
)
from harness.checks.strategies.streams import request_ids, streams
from harness.formats.stream import kv_cache_layout, parse_drawn_stream


@st.composite
def connector_idle_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Requests that finish while a KV producer still sends their pages, and nothing else
    to run until the next one arrives (the bundled sending_requests_keep_the_engine_stepping,
    varied): 1-3 requests of 1-2 outputs one after another, each arriving 1-3 steps after
    the one before is expected to finish, each sent for 1-3 steps.  Whether the engine
    steps while only a send is left (from 0.22.0 it does: stats, the worker's transfer
    report) or idles shows in those steps; scheduler stats are on in three streams of
    four.  ``knobs`` are not used (the requests are built here).
    Shrinks towards: one request sent for one step, stats on, kv_producer.
    """
    vocab = DEFAULT_VOCAB_SIZE
    requests, arrival = [], 0
    for _ in range(draw(st.integers(1, 3))):
        prompt = _tokens(draw, draw(st.integers(1, 8)), vocab)
        output = _tokens(draw, draw(st.integers(1, 2)), vocab)
        request = {"prompt": prompt, "output": output,
                   "kv_transfer": {"send_steps": draw(st.integers(1, 3))}}
        if arrival:
            request["arrival_step"] = arrival
        requests.append(request)
        arrival += len(output) + draw(st.integers(1, 3))  # finished, then a gap
    config = draw(configs(max_model_len=st.integers(16, 24), max_num_batched_tokens=24,
                          max_num_seqs=st.integers(1, 2), spare_blocks=st.integers(1, 6),
                          num_speculative_tokens=0))
    config["kv_role"] = draw(st.sampled_from(["kv_producer", "kv_both"]))
    if not _one_in(draw, 4):
        config["log_stats"] = True
    for rid, q in zip(draw(request_ids(len(requests))), requests):
        q["id"] = rid
    return {"config": config, "requests": requests}


@st.composite
def connector_send_streams(draw, **knobs: Any) -> dict[str, Any]:
    """A KV producer (or ``kv_both``) whose finished requests' pages stay with the
    connector for 1-3 steps while they are sent, and clients that abort a request
    around the time it finishes (three requests in four): before, during or after
    the send, so the abort of a request that has finished but is still known is
    common.
    Streams of :func:`streams` (its own aborts and connector off, no drafts);
    ``knobs`` go to :func:`streams`.
    Shrinks towards: the shrunk stream, its requests sent for one step and aborted
    the step they are expected to finish.
    """
    data = draw(streams(**_with(dict(min_requests=1, max_requests=4, max_arrival_step=4,
                                     aborts=False, kv_connector=False, drafts=False), knobs)))
    config = data["config"]
    if config.get("kv_cache_groups"):
        config = {k: v for k, v in config.items() if k != "kv_cache_groups"}
    data["config"] = {**config, "kv_role": draw(st.sampled_from(["kv_producer", "kv_both"]))}
    budget = config["max_num_batched_tokens"]
    for req in data["requests"]:
        send = draw(st.integers(1, 3))
        req["kv_transfer"] = {"send_steps": send}
        if not _one_in(draw, 4):
            finish = (req.get("arrival_step", 0) + _cdiv(len(req["prompt"]), budget)
                      + len(req["output"]) - 1)
            req["abort_step"] = max(req.get("arrival_step", 0) + 1,
                                    finish + draw(st.integers(0, send + 1)))
    return data


#: The streams async scheduling is drawn over: every kind vLLM 0.11.0 runs under it
#: (no speculative decoding, no KV connector).
def _async_bases(knobs: dict[str, Any]) -> SearchStrategy[dict[str, Any]]:
    """Grammar streams are drawn one time in four: requests waiting for their grammar
    with nothing running make the steps that schedule an empty batch."""
    knobs = _with(dict(drafts=False, kv_connector=False), knobs)
    others = st.one_of(streams(**knobs), preemption_streams(**knobs),
                       prefix_cache_streams(**knobs), chunked_prefill_streams(**knobs),
                       stop_and_abort_streams(**knobs), crowd_streams(**knobs),
                       set_aside_streams(**knobs), hybrid_streams(**knobs),
                       lora_streams(**knobs), mm_streams(**knobs),
                       encoder_pressure_streams(**knobs), pooling_streams(**knobs))
    return _rarely(grammar_streams(**knobs), others, one_in=4)


@st.composite
def async_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Async scheduling (vLLM's AsyncScheduler under EngineCore's batch queue) over the
    other strategies' streams, without drafts and connectors (vLLM refuses the one, the
    harness does not script the other under it): output placeholders, one batch
    ahead, tokens scheduled past a stop, preemption and aborts while a batch is on the
    worker.  The worker is done at once with the batches of some steps (a share of
    0, 1/5, 1/2, 4/5 or all of the steps the stream is likely to take), so the engine
    also applies a batch in the step it scheduled it, and a step that schedules an
    empty batch (finished requests to report, grammars not ready) finds the queue
    empty.  One stream in two has its model length aligned to the page size
    (:func:`_align_model_len`).  KV cache events are on in one stream in two (one KV cache group), so that
    the pages a batch's tokens fill show when they are cached.
    ``knobs`` go to the base strategies.
    Shrinks towards: the shrunk base stream, every batch applied one step late.
    """
    data = draw(_async_bases(knobs))
    config = {k: v for k, v in data["config"].items() if k not in ("kv_role",)}
    config.update(num_speculative_tokens=0, async_scheduling=True)
    if not config.get("kv_cache_groups") and draw(st.booleans()):
        config["kv_cache_events"] = True
    requests = data["requests"]
    horizon = _likely_steps(requests, config)
    _draw_ready_steps(draw, config, horizon, [0.0, 0.2, 0.5, 0.8, 1.0])
    data["config"] = config
    _without_drafts_and_transfers(requests)
    if draw(st.booleans()):
        _align_model_len(data)
    _add_follow_up(draw, data, horizon)
    return data


@st.composite
def pipeline_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Pipeline parallelism as the engine loop sees it: 2 to 4 batches in flight (the
    executor's ``max_concurrent_batches``) over vLLM's synchronous Scheduler, on the
    streams async scheduling is drawn over.  A request whose batch is in flight has
    nothing to schedule, so the next batch takes other requests, or the next chunk of
    a prompt; preemption and aborts meet batches in flight.  The worker is done at
    once with the batches of some steps (as in :func:`async_streams`).
    Shrinks towards: the shrunk base stream, two stages, no batch done at once.
    """
    data = draw(_async_bases(knobs))
    config = {k: v for k, v in data["config"].items() if k not in ("kv_role",)}
    config.update(num_speculative_tokens=0,
                  pipeline_parallel_size=draw(st.integers(2, 4)))
    if config.get("kv_cache_memory_bytes") is not None:  # sized as one worker: in pages
        config["num_gpu_blocks"] = kv_cache_layout(parse_drawn_stream(data).config).num_blocks
        del config["kv_cache_memory_bytes"]
    requests = data["requests"]
    _without_drafts_and_transfers(requests)
    horizon = _likely_steps(requests, config)
    _draw_ready_steps(draw, config, horizon, [0.0, 0.2, 0.5, 1.0])
    data["config"] = config
    _add_follow_up(draw, data, horizon)
    return data
