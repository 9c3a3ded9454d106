"""Streams for the scheduler's own rules: preemption, prefix caching, chunked prefill,
speculative decoding, stops and aborts, and the targeted crowds, set-aside requests and
priority victims that rarer rules need."""

from __future__ import annotations

from typing import Any

from hypothesis.strategies import SearchStrategy

from harness.checks.strategies.configs import configs
from harness.checks.strategies.draws import (
    DEFAULT_VOCAB_SIZE,
    _cdiv,
    _draw_ready_steps,
    _one_in,
    _rarely,
    _tokens,
    _with,
    st,
)
from harness.checks.strategies.streams import request_ids, streams


def _preemption_configs() -> SearchStrategy[dict[str, Any]]:
    """One max_model_len request's pages plus 1-2 spare (0 one time in 8), 2-6 seats."""
    return configs(block_size=st.sampled_from([4, 2, 8]), max_model_len=st.integers(12, 40),
                   spare_blocks=_rarely(st.just(0), st.integers(1, 2)),
                   max_num_seqs=st.integers(2, 6),
                   num_speculative_tokens=_rarely(st.integers(1, 3), st.just(0), one_in=3))


def preemption_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Streams whose pools are so tight that running requests preempt each other.

    The pool holds one max_model_len request plus 1-2 pages (0 now and then);
    2-6 requests arrive within 3 steps and write long outputs; fcfs and
    priority (with priority ties), prefix caching on and off, drafts in a
    third of the streams.  ``knobs`` go to :func:`streams` (``config=``
    replaces the config strategy).
    Shrinks towards: two requests at step 0, one spare page, fcfs.
    """
    return streams(**_with(dict(config=_preemption_configs(), min_requests=2, max_requests=6,
                                max_arrival_step=3, max_output_len=24), knobs))


def prefix_cache_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Streams whose prompts share prefixes, with prefix caching on.

    Prompts come from 1-3 shared prefixes (whole pages and a partial page) or
    extend an earlier request's prompt + output; some requests carry a
    ``cache_salt`` or ask for prompt logprobs (no hit then); some streams
    reset the prefix cache; pools are small enough that cached pages get
    evicted.  ``knobs`` go to :func:`streams`.
    Shrinks towards: two requests, fresh prompts, one spare page.
    """
    config = configs(enable_prefix_caching=True, block_size=st.sampled_from([4, 2, 8]),
                     max_model_len=st.integers(12, 48),
                     spare_blocks=_rarely(st.just(0), st.integers(1, 6)))
    return streams(**_with(dict(config=config, min_requests=2, shared_prefixes="always",
                                max_arrival_step=8), knobs))


@st.composite
def _chunked_configs(draw) -> dict[str, Any]:
    if draw(st.sampled_from([True, False])):  # chunked on, budget under the prompts
        max_model_len = draw(st.integers(16, 48))
        return draw(configs(enable_chunked_prefill=True, max_model_len=max_model_len,
                            max_num_seqs=st.integers(1, 4),
                            budget=st.integers(1, max(2, max_model_len // 3)),
                            long_prefill_token_threshold=st.one_of(
                                st.just(0), st.integers(1, max_model_len // 2))))
    # Chunked off: a whole prompt per step, so the budget covers max_model_len.
    return draw(configs(enable_chunked_prefill=False, max_model_len=st.integers(12, 32),
                        max_num_seqs=st.integers(1, 4),
                        long_prefill_token_threshold=st.one_of(st.just(0), st.integers(1, 16))))


def chunked_prefill_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Streams with long prompts and budgets smaller than them.

    Half of the configs chunk (budget below a third of max_model_len, a
    ``long_prefill_token_threshold`` sometimes), half switch chunked prefill
    off (budget >= max_model_len, whole prompts set aside while they do not
    fit).  ``knobs`` go to :func:`streams`.
    Shrinks towards: chunked on, one seat, budget 1, one long prompt.
    """
    return streams(**_with(dict(config=_chunked_configs(), min_prompt_len=8,
                                max_prompt_len=40, max_arrival_step=6), knobs))


def spec_decode_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Streams with speculative decoding: ngram or eagle, 1-4 draft tokens.

    Most requests carry draft lists built from their own future output with
    some tokens changed (see ``_draw_drafts``); outputs are long enough for
    several rounds.  ``knobs`` go to :func:`streams`.
    Shrinks towards: ngram with one draft token, short all-wrong drafts.
    """
    config = configs(num_speculative_tokens=st.integers(1, 4),
                     speculative_method=st.sampled_from(["ngram", "eagle"]),
                     max_model_len=st.integers(16, 48))
    return streams(**_with(dict(config=config, drafts=True, max_output_len=24), knobs))


def stop_and_abort_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Streams that exercise every stop rule and aborts in every state.

    Every stop mode of :data:`STOP_MODES` (EOS, stop tokens, max_tokens,
    max_model_len, ignore_eos, script end); aborts on about half of the
    requests, 1-12 steps after arrival, with few seats or (half the time) the
    tight pools of :func:`preemption_streams`, so that waiting, running and
    preempted requests all get aborted.
    ``knobs`` go to :func:`streams`.
    Shrinks towards: one request ending with its script, no abort.
    """
    config = st.one_of(
        configs(max_model_len=st.integers(8, 32),
                spare_blocks=_rarely(st.just(0), st.integers(1, 3)),
                max_num_seqs=st.integers(1, 4)),
        _preemption_configs())
    return streams(**_with(dict(config=config, min_requests=1, max_requests=6, aborts=True,
                                abort_one_in=2, max_abort_delay=12, max_arrival_step=4,
                                max_output_len=20), knobs))


def crowd_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Crowds: 8-20 requests, or 64-72 one time in four, arriving in 1-3 bursts,
    two priority levels.

    Many ties of arrival step and priority, ids in no particular order, 2-8
    seats and pools of a few spare pages, so that the running list, the
    waiting queue and the preemption victims are ordered by arrival and
    running order while ids say something else (tie-breaks, fcfs victims
    that resumed behind newer requests, outputs taken in scheduling order).
    Short prompts and outputs keep each run within a few hundred steps.
    ``knobs`` go to :func:`streams`.
    Shrinks towards: 8 requests at step 0, fcfs.  (``min_requests`` and
    ``max_requests`` in ``knobs`` override the drawn crowd size.)
    """
    config = configs(block_size=st.sampled_from([4, 2, 8]), max_model_len=st.integers(12, 32),
                     max_num_seqs=st.integers(2, 8), spare_blocks=st.integers(0, 6),
                     budget=st.integers(8, 48), max_steps=1000)
    return _crowd(config, knobs)


@st.composite
def _crowd(draw, config, knobs: dict[str, Any]) -> dict[str, Any]:
    # One crowd in four is 64-72 requests; the others 8-20 (they cost a run each).
    size = draw(_rarely(st.integers(64, 72), st.integers(8, 20), one_in=4))
    return draw(streams(**_with(dict(config=config, min_requests=size, max_requests=size,
                                     bursts=3, max_arrival_step=8, max_prompt_len=12,
                                     max_output_len=8, priority_values=st.integers(0, 1),
                                     abort_one_in=8), knobs)))


@st.composite
def _set_aside_configs(draw, threshold: bool | None) -> dict[str, Any]:
    max_model_len = draw(st.integers(12, 32))
    some = st.integers(1, max_model_len // 2)
    return draw(configs(
        enable_chunked_prefill=False, max_model_len=max_model_len,
        max_num_seqs=st.integers(2, 6), spare_blocks=_rarely(st.integers(4, 12), st.integers(0, 3)),
        max_num_batched_tokens=st.integers(max_model_len, max_model_len + max_model_len // 2),
        long_prefill_token_threshold=(st.one_of(st.just(0), some) if threshold is None
                                      else some if threshold else 0),
        policy=_rarely(st.just("priority"), st.just("fcfs"), one_in=4)))


@st.composite
def set_aside_streams(draw, *, threshold: bool | None = None, **knobs: Any) -> dict[str, Any]:
    """Chunked prefill off, and several waiting prompts too long for what is left.

    A budget between max_model_len and 1.5 times it, bursts of 3-12 requests
    with prompts of any length up to the model's, and a long-prefill
    threshold in half of the configs: steps set aside two or more requests
    (0.11.0 puts them back reversed; 0.12.0 stops at the first), and the
    threshold decides before the whole-prompt test whether one fits.  Pools
    are tight (0-3 spare pages, now and then more) and in half of the streams
    the earliest arrivals have the longest prompts, so that requests join the
    running list out of arrival order and then get preempted: the fcfs victim
    is the last to join, not the newest arrival.  No aborts.  ``threshold``
    True or False forces a threshold on or off (None: half of the configs).
    ``knobs`` go to :func:`streams`.
    Shrinks towards: three requests at step 0, fcfs, no threshold.
    """
    data = draw(streams(**_with(dict(config=_set_aside_configs(threshold), min_requests=3,
                                     max_requests=12, bursts=2, max_arrival_step=6,
                                     max_prompt_len=32, max_output_len=24,
                                     shared_prefixes=False, aborts=False), knobs)))
    if _one_in(draw, 2):
        _longest_prompts_first(data["requests"])
    return data


def _longest_prompts_first(requests: list[dict[str, Any]]) -> None:
    """Give the earliest arrivals the longest prompts (each request's prompt, script and
    stop fields move together; ids and arrival steps stay), so that the long ones are
    set aside and join the running list after shorter, newer ones."""
    kept = ("id", "arrival_step")
    bodies = sorted(({k: v for k, v in r.items() if k not in kept} for r in requests),
                    key=lambda body: -len(body["prompt"]))
    for request, body in zip(requests, bodies):
        head = {k: request[k] for k in kept if k in request}
        request.clear()
        request.update(head, **body)


@st.composite
def priority_victim_streams(draw, *, drafts: bool | None = None, **knobs: Any) -> dict[str, Any]:
    """Priority scheduling where the victim was already scheduled in the same step.

    Less urgent requests arrive first, so they stand first in the running list
    and are scheduled before the urgent ones that later need pages from a
    tight pool: the victim (the least urgent) already holds this step's grant
    (quirks.PRIORITY_VICTIM_KEEPS_ITS_GRANT, and with drafts
    REJECTED_DRAFTS_ALWAYS_SUBTRACTED).  Drafts in three configs of four
    (``drafts`` True or False: in every config or in none).
    ``knobs`` go to :func:`streams`.
    Shrinks towards: two requests, equal priorities, drafts of one token.
    """
    config = configs(policy="priority", block_size=st.sampled_from([4, 2, 8]),
                     max_model_len=st.integers(12, 40), spare_blocks=st.integers(0, 2),
                     max_num_seqs=st.integers(2, 6),
                     num_speculative_tokens=(_rarely(st.just(0), st.integers(1, 3), one_in=4)
                                             if drafts is None
                                             else st.integers(1, 3) if drafts else 0))
    data = draw(streams(**_with(dict(config=config, min_requests=2, max_requests=6,
                                     max_arrival_step=3, max_output_len=24,
                                     priorities=False), knobs)))
    levels = sorted(draw(st.lists(st.integers(0, 3), min_size=len(data["requests"]),
                                  max_size=len(data["requests"]))), reverse=True)
    for request, level in zip(data["requests"], levels):
        if level:
            request["priority"] = level
    return data


@st.composite
def priority_victim_window_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Priority victims of a hybrid model: a full-attention group beside a sliding window
    of at most a page, or chunked local attention with one-page chunks.

    The longest prompt arrives first, least urgent, and prefills in chunks of the
    long-prefill threshold (4-8 tokens), so it is scheduled first in each step with a
    chunk as its grant; the others arrive one or two steps later, more urgent, and need
    the last pages of a tight pool.  A victim that keeps its grant
    (quirks.PRIORITY_VICTIM_KEEPS_ITS_GRANT) resumes with that count and no pages, and in
    0.11.0 the window's group then indexes its empty block table
    (quirks.PRIORITY_VICTIM_INDEX_ERROR, first found by an unseen fuzz seed): about one
    stream in five of the ci profile.  ``knobs`` go to :func:`streams`.
    Shrinks towards: two requests, pages of one token, a window of one token.
    """
    block_size = draw(st.sampled_from([1, 2, 4]))
    other = ({"type": "chunked_local", "attention_chunk_size": block_size} if _one_in(draw, 3)
             else {"type": "sliding_window", "sliding_window": draw(st.integers(1, block_size))})
    config = configs(policy="priority", block_size=block_size, max_model_len=st.integers(16, 24),
                     kv_cache_groups=[{"type": "full"}, other], enable_chunked_prefill=True,
                     long_prefill_token_threshold=st.integers(4, 8), budget=st.integers(6, 12),
                     spare_blocks=st.integers(0, 1), max_num_seqs=st.integers(2, 4),
                     num_speculative_tokens=0)
    data = draw(streams(**_with(dict(config=config, min_requests=2, max_requests=4,
                                     max_arrival_step=0, min_prompt_len=10, max_prompt_len=24,
                                     max_output_len=8, priorities=False, aborts=False), knobs)))
    # The longest prompt arrives first, least urgent; the others while it prefills.
    requests = data["requests"]
    requests.insert(0, requests.pop(max(range(len(requests)),
                                        key=lambda i: len(requests[i]["prompt"]))))
    requests[0]["priority"] = 2
    later = sorted(draw(st.lists(st.integers(1, 2), min_size=len(requests) - 1,
                                 max_size=len(requests) - 1)))
    for request, step in zip(requests[1:], later):
        request["arrival_step"] = step
        level = draw(st.integers(0, 1))
        if level:
            request["priority"] = level
    return data


def set_aside_threshold_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """:func:`set_aside_streams` with a long-prefill threshold in every config: the
    threshold caps a prompt before the whole-prompt test decides whether it fits."""
    return set_aside_streams(threshold=True, **knobs)


def priority_victim_draft_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """:func:`priority_victim_streams` with drafts in every config and 3-8 requests: a
    victim that keeps its grant also has its rejected drafts taken back."""
    return priority_victim_streams(drafts=True, **_with(dict(min_requests=3, max_requests=8),
                                                        knobs))


@st.composite
def passed_over_victim_streams(draw, **knobs: Any) -> dict[str, Any]:
    """A priority victim the pass has already passed over (the bundled
    passed_over_victim_keeps_the_pass, varied).  Under two pipeline stages a decoding
    request gets a token every other step: the steps between, its token is still on the
    worker and the pass goes by it.  ``v``, the least urgent, arrives first and decodes
    in the even steps; ``x`` and ``y``, more urgent, arrive together in an odd step and
    decode in the odd ones, in a pool of their prompts' pages and 0-4 more.  When ``x``
    needs a page that is not there, ``v`` (index 0, passed over) is the victim; whether
    the pass steps back with it decides whether ``y``, right after ``x``, gets its token
    in that step (from 0.28.0 it does).  The worker is done at once with a drawn share
    of the steps.  ``knobs`` are not used (the requests are built here).
    Shrinks towards: 4-token pages, arrival at step 1, one-token prompts, no spare page.
    """
    vocab = DEFAULT_VOCAB_SIZE
    block_size = draw(st.sampled_from([4, 2, 8]))
    arrival = draw(st.sampled_from([1, 3, 5]))

    def request(priority: int, arrival_step: int) -> dict[str, Any]:
        q = {"prompt": _tokens(draw, draw(st.integers(1, 12)), vocab),
             "output": _tokens(draw, draw(st.integers(4, 16)), vocab), "priority": priority}
        if arrival_step:
            q["arrival_step"] = arrival_step
        return q

    requests = [request(draw(st.integers(2, 4)), 0), request(draw(st.integers(0, 1)), arrival),
                request(draw(st.integers(0, 1)), arrival)]
    max_model_len = max(len(q["prompt"]) + len(q["output"]) for q in requests) \
        + draw(st.integers(1, 4))
    prompts = sum(_cdiv(len(q["prompt"]) + 1, block_size) for q in requests)
    pool = 1 + max(prompts + draw(st.integers(0, 4)), _cdiv(max_model_len, block_size))
    config = draw(configs(block_size=block_size, max_model_len=max_model_len,
                          enable_chunked_prefill=True,
                          enable_prefix_caching=st.sampled_from([False, True]), max_num_seqs=3,
                          max_num_batched_tokens=40, long_prefill_token_threshold=0,
                          num_gpu_blocks=pool, policy="priority", num_speculative_tokens=0))
    config["pipeline_parallel_size"] = 2
    _draw_ready_steps(draw, config, 24, [0.0, 0.0, 0.5, 1.0])
    for rid, q in zip(draw(request_ids(len(requests))), requests):
        q["id"] = rid
    return {"config": config, "requests": requests}
