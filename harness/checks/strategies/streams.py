"""The general stream strategy, :func:`streams`: requests for a config, with knobs that
switch features (shared prefixes, stop rules, aborts, salts, drafts, transfers, grammars)
on or off."""

from __future__ import annotations

from typing import Any

from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from harness.checks.strategies.configs import configs
from harness.checks.strategies.draws import (
    DEFAULT_VOCAB_SIZE,
    STOP_MODES,
    _draw_drafts,
    _draw_output,
    _draw_prompt,
    _memoized,
    _one_in,
    _prefix_pool,
    st,
)
from harness.formats.stream import RequestSpec


@st.composite
def streams(draw, config: dict[str, Any] | SearchStrategy | None = None,
            min_requests: int = 1, max_requests: int = 6, *,
            vocab_size: int = DEFAULT_VOCAB_SIZE,
            max_arrival_step: int = 10,
            min_prompt_len: int = 1,
            max_prompt_len: int = 24,
            max_output_len: int = 16,
            shared_prefixes: bool | str = True,
            stop_modes: tuple[str, ...] = STOP_MODES,
            aborts: bool = True,
            abort_one_in: int = 4,
            max_abort_delay: int = 20,
            priorities: bool = True,
            cache_salts: bool = True,
            prompt_logprobs: bool = True,
            resets: bool = True,
            drafts: bool = True,
            bursts: int = 0,
            priority_values: SearchStrategy[int] = st.integers(0, 2),
            cut_earlier: bool = False,
            adapters: tuple[str, ...] = ("sql", "chat", "code", "math"),
            grammars: bool = False,
            stats: bool = True, kv_events: bool = True,
            kv_connector: bool = True) -> dict[str, Any]:
    """A valid stream dict: ``{"config": ..., "requests": [...]}``.

    ``config`` is a config dict, a strategy of config dicts, or None for
    :func:`configs`.  Requests are listed in arrival order (arrival steps
    ascend, with ties) over ``0 .. max_arrival_step``; their ids are drawn
    apart from that order (:func:`request_ids`), so no rule can pass by
    mistaking an id for an arrival.  The knobs switch features on (the
    strategy then *may* use them) or off:

    * ``vocab_size`` -- token ids are ``0 .. vocab_size - 1``;
    * ``min_prompt_len``/``max_prompt_len``/``max_output_len`` -- lengths,
      always cut to what ``max_model_len`` allows;
    * ``shared_prefixes`` -- prompts built from 1-3 shared prefixes (whole
      pages and partial pages) or from an earlier request's prompt + output;
      ``"always"`` draws the prefixes in every stream, ``True`` in some;
    * ``stop_modes`` -- the subset of :data:`STOP_MODES` each request draws
      its stop rule from;
    * ``aborts`` (one request in ``abort_one_in`` gets an ``abort_step``
      1 .. ``max_abort_delay`` steps after its arrival), ``priorities``
      (0-2, ties common), ``cache_salts`` (two salts), ``prompt_logprobs``, ``resets``
      (``reset_prefix_cache_steps``) and ``drafts`` (draft lists when the
      config has ``num_speculative_tokens > 0``);
    * ``bursts`` -- when positive, requests arrive together at most that many
      distinct steps (ties of arrival step), else anywhere in the range;
    * ``priority_values`` -- the strategy a request's priority comes from;
    * ``cut_earlier`` -- a prompt may also be the first tokens of an earlier
      request's prompt + output (its hit ends inside the earlier one);
    * ``adapters`` -- when the config has ``max_loras``, three requests in four
      name one of these LoRA adapters;
    * ``grammars`` -- half of the requests use structured output: a grammar
      ready at arrival or 1-4 steps later, rejecting 1-3 tokens its output
      never holds, which some of its drafts do;
    * ``stats`` -- half of the streams keep scheduler stats (``log_stats``);
    * ``kv_events`` -- half of the streams with one KV cache group publish KV cache
      events (``kv_cache_events``; vLLM has none with several);
    * ``kv_connector`` -- a third of the streams with one KV cache group run a scripted
      KV connector (``kv_role``); three requests in four then get a ``kv_transfer``.

    Shrinks towards: the shrunk config, ``min_requests`` requests arriving at
    step 0, fresh short prompts, the first stop mode in ``stop_modes``, and
    every optional feature left out.
    """
    if config is None:
        config = draw(configs())
    elif isinstance(config, SearchStrategy):
        config = draw(config)
    else:
        config = dict(config)
    if not 1 <= min_requests <= max_requests:
        raise InvalidArgument("streams(): need 1 <= min_requests <= max_requests")
    if vocab_size < 2:
        raise InvalidArgument("streams(): vocab_size must be >= 2")
    bad = set(stop_modes) - set(STOP_MODES)
    if bad or not stop_modes:
        raise InvalidArgument(f"streams(): stop_modes must be a non-empty subset of {STOP_MODES}")
    num_spec = config.get("num_speculative_tokens", 0)
    max_model_len = config["max_model_len"]
    max_len = max(1, min(max_prompt_len, max_model_len - 1))
    min_len = max(1, min(min_prompt_len, max_len))

    use_prefixes = shared_prefixes == "always" or (shared_prefixes and draw(st.booleans()))
    prefixes = draw(_prefix_pool(config, vocab_size)) if use_prefixes else []
    count = draw(st.integers(min_requests, max_requests))
    arrivals = draw(_arrival_steps(count, max_arrival_step, bursts))
    ids = draw(request_ids(count))
    requests: list[dict[str, Any]] = []
    for rid, arrival in zip(ids, arrivals):
        prompt = _draw_prompt(draw, config, requests, prefixes, vocab_size, min_len, max_len,
                              cut_earlier)
        req: dict[str, Any] = {"id": rid, "prompt": prompt}
        if arrival:
            req["arrival_step"] = arrival
        req.update(_draw_output(draw, config, len(prompt), vocab_size, stop_modes, max_output_len))
        if priorities and draw(st.booleans()):
            req["priority"] = draw(priority_values)
        if aborts and _one_in(draw, abort_one_in):
            req["abort_step"] = arrival + draw(st.integers(1, max_abort_delay))
        if cache_salts and _one_in(draw, 4):
            req["cache_salt"] = draw(st.sampled_from(["a", "b"]))
        if prompt_logprobs and _one_in(draw, 4):
            req["prompt_logprobs"] = draw(st.integers(0, 2))
        if drafts and num_spec > 0 and draw(st.integers(0, 4)) > 0:
            spec = _spec_of(req)
            req["drafts"] = _draw_drafts(draw, req["output"], spec.stop_index(max_model_len),
                                         num_spec, vocab_size)
        if config.get("max_loras") is not None and adapters and not _one_in(draw, 4):
            req["lora"] = draw(st.sampled_from(adapters))
        if grammars and draw(st.booleans()):
            req["structured_output"] = _draw_grammar(draw, req, arrival, vocab_size)
        requests.append(req)

    data: dict[str, Any] = {"config": config, "requests": requests}
    if resets and _one_in(draw, 4):
        data["reset_prefix_cache_steps"] = sorted(set(
            draw(st.lists(st.integers(0, max_arrival_step + 20), min_size=1, max_size=3))))
    if stats and draw(st.booleans()):
        data["config"] = {**data["config"], "log_stats": True}
    if kv_events and len(config.get("kv_cache_groups") or [None]) == 1 and draw(st.booleans()):
        data["config"] = {**data["config"], "kv_cache_events": True}
    if kv_connector and len(config.get("kv_cache_groups") or [None]) == 1 and _one_in(draw, 3):
        role = draw(st.sampled_from(["kv_both", "kv_consumer", "kv_producer"]))
        data["config"] = {**data["config"], "kv_role": role}
        for req in requests:
            if draw(st.integers(0, 3)) > 0:  # shrinks to no transfer
                req["kv_transfer"] = _draw_kv_transfer(draw, role, len(req["prompt"]))
    return data


def _draw_kv_transfer(draw, role: str, prompt_len: int) -> dict[str, Any]:
    """One request's part of the connector script for ``role``: a consumer loads (often
    the whole prompt, often asynchronously), a producer keeps finished pages to send
    them, kv_both may do either.  Shrinks towards nothing to load or send."""
    t: dict[str, Any] = {}
    if role != "kv_producer" and draw(st.booleans()):
        t["external_tokens"] = draw(st.one_of(st.just(prompt_len), st.integers(0, prompt_len)))
        if draw(st.booleans()):
            t["load_async"] = True
            t["load_steps"] = draw(st.integers(0, 3))
        if _one_in(draw, 4):
            t["unknown_lookups"] = draw(st.integers(1, 2))
    if role != "kv_consumer" and draw(st.booleans()):
        t["send_steps"] = draw(st.integers(1, 3))
    return t


def _draw_grammar(draw, req: dict[str, Any], arrival: int, vocab: int) -> dict[str, Any]:
    """A scripted grammar for ``req``: ready at arrival (half the time) or 1-4 steps
    later, rejecting 1-3 tokens the output never holds; one draft list in three
    gets a rejected token, so that the grammar cuts it.  Shrinks towards a grammar
    ready at once that rejects the smallest token the output does not hold."""
    free = [t for t in range(vocab) if t not in req["output"]]
    delay = draw(st.one_of(st.just(0), st.integers(1, 4)))
    grammar: dict[str, Any] = {"ready_step": arrival + delay}
    if not free:
        return grammar
    rejected = draw(st.lists(st.sampled_from(free), min_size=1, max_size=3, unique=True))
    grammar["rejected_tokens"] = rejected
    for d in req.get("drafts", []):
        if d and _one_in(draw, 3):
            d[draw(st.integers(0, len(d) - 1))] = draw(st.sampled_from(rejected))
    return grammar


@_memoized
def request_ids(count: int) -> SearchStrategy[list[str]]:
    """``count`` distinct ids ``r<n>``, ``n`` in 0..999 drawn in any order: arrival
    order, numeric order and string order (``"r10" < "r9"``) all disagree.
    Shrinks towards ``r0, r1, ...`` in arrival order."""
    return st.lists(st.integers(0, 999), min_size=count, max_size=count, unique=True).map(
        lambda ns: [f"r{n}" for n in ns])


@_memoized
@st.composite
def _arrival_steps(draw, count: int, max_step: int, bursts: int) -> list[int]:
    """Ascending arrival steps; with ``bursts``, drawn from at most that many steps."""
    if bursts > 0:
        steps = draw(st.lists(st.integers(0, max_step), min_size=1, max_size=bursts))
        return sorted(draw(st.sampled_from(steps)) for _ in range(count))
    return sorted(draw(st.lists(st.integers(0, max_step), min_size=count, max_size=count)))


def _spec_of(req: dict[str, Any]) -> RequestSpec:
    return RequestSpec(id=req["id"], prompt=tuple(req["prompt"]), output=tuple(req["output"]),
                       max_tokens=req.get("max_tokens"), eos_token_id=req.get("eos_token_id"),
                       stop_token_ids=tuple(req.get("stop_token_ids", ())),
                       ignore_eos=req.get("ignore_eos", False))
