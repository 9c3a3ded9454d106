"""The features of the stream format an engine can declare it models.

A simulator of vLLM's scheduler models part of it: nano-vllm has no chunked prefill,
Vidur has no EOS and no prefix cache.  An engine declares once what it models
(``features = {"prefix_caching", "eos", ...}``); every stream it is given is then drawn
inside those features (:func:`fit`, applied to each stream a strategy draws), so that
the streams of a profile are taken, not drawn and turned away.

Every stream has requests with a prompt, an output script and ``max_tokens``, arriving
at steps, under first-come-first-served scheduling, in a pool of ``num_gpu_blocks``
pages of one full-attention KV cache group: that is the part every engine models.  Each
feature below is a part some engine leaves out.  ``fit`` takes a stream's JSON and
removes the features not declared, keeping the stream valid:

* a request that would stop at an EOS or a stop token the engine does not model stops
  by length at the same output instead (its output script is cut there, ``max_tokens``
  set to it), so every step that schedules it schedules the same tokens;
* without an EOS of each request's own, every request gets the first EOS named, its
  script rewritten to stop where it stopped (a stand-in token where it says that EOS
  without stopping);
* without chunked prefill the token budget is raised to ``max_model_len``, as vLLM
  requires;
* without a pool sized from memory the pool is ``num_gpu_blocks`` pages.

Two features only observe (``stats``, ``kv_events``): they never make an engine refuse a
stream (:func:`missing` leaves them out); a trace of an engine without them carries no
stats or events, which matters only at the fidelity level that compares those fields
(:mod:`harness.checks.levels`).  Streams drawn for an engine leave them out like any
other feature it does not declare.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable, Iterable

from harness.formats.stream import StreamError, parse_stream

Stream = dict[str, Any]


def _config(s: Stream) -> dict[str, Any]:
    return s.setdefault("config", {})


def _requests(s: Stream) -> list[dict[str, Any]]:
    return s.get("requests", [])


# -- which features a stream uses ---------------------------------------------------------

def _any_request(key: str, absent=None) -> Callable[[Stream], bool]:
    return lambda s: any(r.get(key, absent) not in (absent, None, [], ()) for r in _requests(s))


def _config_set(key: str, off) -> Callable[[Stream], bool]:
    return lambda s: _config(s).get(key, off) not in (off, None)


def _stops_on(s: Stream, kind: str) -> bool:
    return any(_stop_kind(r, _config(s).get("max_model_len", 256)) == kind for r in _requests(s))


USES: dict[str, Callable[[Stream], bool]] = {
    "chunked_prefill": lambda s: _config(s).get("enable_chunked_prefill", True),
    "long_prefill_threshold": lambda s: _config(s).get("long_prefill_token_threshold", 0) > 0,
    "prefix_caching": lambda s: _config(s).get("enable_prefix_caching", True),
    "prefix_cache_reset": lambda s: bool(s.get("reset_prefix_cache_steps")),
    "cache_salt": _any_request("cache_salt"),
    "eos": lambda s: _stops_on(s, "eos") or any(r.get("ignore_eos") for r in _requests(s)),
    "stop_tokens": lambda s: _stops_on(s, "stop_token"),
    "eos_per_request": lambda s: len({r.get("eos_token_id") for r in _requests(s)}) > 1,
    "model_len_stop": lambda s: any(_capped_by_model_len(r, _config(s).get("max_model_len", 256))
                                    for r in _requests(s)),
    "abort": _any_request("abort_step"),
    "priority": lambda s: _config(s).get("policy", "fcfs") != "fcfs",
    "prompt_logprobs": _any_request("prompt_logprobs"),
    "spec_decode": lambda s: _config(s).get("num_speculative_tokens", 0) > 0,
    "hybrid": _config_set("kv_cache_groups", None),
    "lora": lambda s: _config(s).get("max_loras") is not None or _any_request("lora")(s),
    "structured_output": _any_request("structured_output"),
    "multimodal": lambda s: _any_request("mm_inputs")(s) or any(
        _config(s).get(k) is not None for k in
        ("encoder_compute_budget", "encoder_cache_size", "max_tokens_per_mm_item")),
    "pooling": _any_request("pooling", False),
    "kv_connector": _config_set("kv_role", None),
    "async_scheduling": _config_set("async_scheduling", False),
    "pipeline_parallel": lambda s: _config(s).get("pipeline_parallel_size", 1) > 1,
    "memory_sizing": _config_set("kv_cache_memory_bytes", None),
    "stats": _config_set("log_stats", False),
    "kv_events": _config_set("kv_cache_events", False),
}

#: What each feature is, in a phrase (refusals and reports name it).
DESCRIBED = {
    "chunked_prefill": "chunked prefill (a prompt split over steps)",
    "long_prefill_threshold": "a long-prefill token threshold",
    "prefix_caching": "the prefix cache",
    "prefix_cache_reset": "prefix cache resets",
    "cache_salt": "cache salts",
    "eos": "EOS (and ignore_eos)",
    "eos_per_request": "an EOS of each request's own (not one per engine)",
    "model_len_stop": "the stop at max_model_len",
    "stop_tokens": "stop tokens",
    "abort": "aborted requests",
    "priority": "priority scheduling",
    "prompt_logprobs": "prompt logprobs",
    "spec_decode": "speculative decoding",
    "hybrid": "hybrid KV cache groups",
    "lora": "LoRA adapters",
    "structured_output": "structured output",
    "multimodal": "multimodal inputs",
    "pooling": "pooling requests",
    "kv_connector": "a KV connector",
    "async_scheduling": "async scheduling",
    "pipeline_parallel": "pipeline parallelism",
    "memory_sizing": "a pool sized from memory",
    "stats": "scheduler stats",
    "kv_events": "KV cache events",
}

FEATURES = tuple(USES)
#: Features that only observe: never a reason to refuse a stream.
OBSERVED = frozenset({"stats", "kv_events"})
#: Features that need another: fitting one away fits these away too.
NEEDS = {"prefix_cache_reset": "prefix_caching", "cache_salt": "prefix_caching",
         "eos_per_request": "eos"}


def check_declared(features: Iterable[str], who: str) -> frozenset[str]:
    """``features`` as a set, or ValueError naming the first unknown one."""
    declared = frozenset(features)
    unknown = sorted(declared - set(FEATURES))
    if unknown:
        raise ValueError(f"{who}: unknown feature {unknown[0]!r} (features: "
                         f"{', '.join(FEATURES)})")
    return declared


def used(stream: Stream) -> list[str]:
    """The features a stream (its JSON) uses, in vocabulary order."""
    return [name for name, uses in USES.items() if uses(stream)]


def missing(stream: Stream, declared: Iterable[str]) -> list[str]:
    """The features the stream uses that ``declared`` lacks (observed ones left out)."""
    have = set(declared)
    return [f for f in used(stream) if f not in have and f not in OBSERVED]


# -- drawing inside the declared features --------------------------------------------------

def _stop_kind(r: dict[str, Any], max_model_len: int) -> str:
    """How a request's script stops it: ``eos``, ``stop_token`` or ``length``."""
    output = r.get("output", [])
    limit = min(len(output) if r.get("max_tokens") is None else r["max_tokens"],
                max_model_len - len(r.get("prompt", [])))
    stops = set(r.get("stop_token_ids") or ())
    for token in output[:max(limit, 0)]:
        if token in stops:
            return "stop_token"
        if not r.get("ignore_eos") and r.get("eos_token_id") is not None \
                and token == r["eos_token_id"]:
            return "eos"
    return "length"


def _stop_by_length(r: dict[str, Any], max_model_len: int) -> None:
    """The request stops where its script stopped it, by length: no EOS, no stop tokens."""
    end = _stop_end(r, max_model_len)
    r["output"] = list(r.get("output", [])[:end])
    r["max_tokens"] = end
    for key in ("eos_token_id", "stop_token_ids", "ignore_eos"):
        r.pop(key, None)


def _capped_by_model_len(r: dict[str, Any], max_model_len: int) -> bool:
    """Whether the request stops because it fills the model, not at its own limit."""
    room = max_model_len - len(r.get("prompt", []))
    asked = len(r.get("output", [])) if r.get("max_tokens") is None else r["max_tokens"]
    return room < asked and _stop_end(r, max_model_len) == room


def _no_model_len_stop(s: Stream) -> None:
    """A request stopped by the model's length asks for exactly that many outputs: it
    stops at the same output, by its own limit."""
    mml = _config(s).get("max_model_len", 256)
    for r in _requests(s):
        if _capped_by_model_len(r, mml):
            r["max_tokens"] = mml - len(r["prompt"])


def _drop_request_key(key: str) -> Callable[[Stream], None]:
    def drop(s: Stream) -> None:
        for r in _requests(s):
            r.pop(key, None)
    return drop


def _drop_config(*keys: str) -> Callable[[Stream], None]:
    def drop(s: Stream) -> None:
        for key in keys:
            _config(s).pop(key, None)
    return drop


def _no_chunked_prefill(s: Stream) -> None:
    c = _config(s)
    c["enable_chunked_prefill"] = False
    c["max_num_batched_tokens"] = max(c.get("max_num_batched_tokens", 128),
                                      c.get("max_model_len", 256))


def _no_prefix_caching(s: Stream) -> None:
    _config(s)["enable_prefix_caching"] = False


def _no_eos(s: Stream) -> None:
    """Requests an EOS (or ignore_eos) stopped stop by length at the same output; no
    request names an EOS any more."""
    mml = _config(s).get("max_model_len", 256)
    for r in _requests(s):
        if _stop_kind(r, mml) == "eos" or r.get("ignore_eos"):
            _stop_by_length(r, mml)
        r.pop("eos_token_id", None)


def _no_stop_tokens(s: Stream) -> None:
    mml = _config(s).get("max_model_len", 256)
    for r in _requests(s):
        if _stop_kind(r, mml) == "stop_token":
            _stop_by_length(r, mml)
        else:
            r.pop("stop_token_ids", None)


def _one_eos(s: Stream) -> None:
    """Every request gets the first EOS named; each script is rewritten so the request
    stops where it stopped (:func:`_say_common_eos`)."""
    mml = _config(s).get("max_model_len", 256)
    named = [r["eos_token_id"] for r in _requests(s) if r.get("eos_token_id") is not None]
    if not named:
        return
    for r in _requests(s):
        _say_common_eos(r, named[0], mml)


def _say_common_eos(r: dict[str, Any], common: int, max_model_len: int) -> None:
    """The request's script under the one EOS ``common``, stopping where it stopped: its
    own EOS becomes the common one, and the common one said anywhere else a stand-in
    (:func:`_stand_in`, avoiding its stop tokens).  Where that makes it say a token its
    grammar rejects, or stop elsewhere (at a stop token that is the common EOS), the
    stand-in avoids the rejected tokens too and the stop token it stops at stays.  A request
    whose grammar rejects the common EOS cannot say it: it stops by length there."""
    kind, end = _stop_kind(r, max_model_len), _stop_end(r, max_model_len)
    if kind == "eos" and common in _rejected(r):
        r["output"], r["max_tokens"], kind = r["output"][:end], end, "length"
    script, stops = list(r.get("output", [])), set(r.get("stop_token_ids") or ())
    r["eos_token_id"] = common
    r["output"] = _with_stand_in(script, common, kind, end, stops)
    if _stop_end(r, max_model_len) != end or _rejected(r) & set(r["output"][:end]):
        r["output"] = _with_stand_in(script, common, kind, end, stops | _rejected(r),
                                     keep=end - 1 if kind == "stop_token" else None)


def _with_stand_in(script: list[int], common: int, kind: str, end: int, avoid: set[int],
                   keep: int | None = None) -> list[int]:
    """``script`` saying the common EOS where the request stops by EOS (``kind``, at
    ``end``), and a stand-in avoiding ``avoid`` wherever else it says it, except at index
    ``keep``."""
    out = list(script)
    said = [i for i, t in enumerate(out) if t == common and i != keep]
    if said:
        other = _stand_in(common, avoid)
        for i in said:
            out[i] = other
    if kind == "eos":
        out[end - 1] = common
    return out


def _rejected(r: dict[str, Any]) -> set[int]:
    """The tokens the request's grammar never lets it sample."""
    return set((r.get("structured_output") or {}).get("rejected_tokens") or ())


#: Stand-ins are taken among token ids up to this one first, as they always were.
STAND_IN_CEILING = 100_000
#: Token ids are below this (the stream format's bound).
TOKEN_LIMIT = 2 ** 31


def _stand_in(common: int, avoid: set[int]) -> int:
    """The token put where a request says the common EOS without stopping at it: the
    nearest one to it (above before below, ids up to :data:`STAND_IN_CEILING` first)
    that ``avoid`` lacks."""
    reach = len(avoid) + 2  # so many ids on either side hold one not avoided
    near = range(max(common - reach, 0), min(common + reach, TOKEN_LIMIT - 1) + 1)
    return min((t for t in near if t != common and t not in avoid),
               key=lambda t: (t > STAND_IN_CEILING, abs(t - common), t < common))


def _stop_end(r: dict[str, Any], max_model_len: int) -> int:
    """How many outputs the request's script lets it produce."""
    output = r.get("output", [])
    limit = min(len(output) if r.get("max_tokens") is None else r["max_tokens"],
                max_model_len - len(r.get("prompt", [])))
    stops = set(r.get("stop_token_ids") or ())
    for i, token in enumerate(output[:max(limit, 0)]):
        if token in stops or (not r.get("ignore_eos") and r.get("eos_token_id") is not None
                              and token == r["eos_token_id"]):
            return i + 1
    return limit


def _no_priority(s: Stream) -> None:
    _config(s).pop("policy", None)
    _drop_request_key("priority")(s)


def _no_spec_decode(s: Stream) -> None:
    _drop_config("num_speculative_tokens", "speculative_method")(s)
    _drop_request_key("drafts")(s)


def _no_lora(s: Stream) -> None:
    _drop_config("max_loras")(s)
    _drop_request_key("lora")(s)


def _no_multimodal(s: Stream) -> None:
    _drop_config("encoder_compute_budget", "encoder_cache_size", "max_tokens_per_mm_item",
                 "disable_chunked_mm_input")(s)
    _drop_request_key("mm_inputs")(s)


def _no_pooling(s: Stream) -> None:
    for r in _requests(s):
        if r.pop("pooling", False):
            r["output"] = [r["prompt"][-1]]  # one sampled token: the prompt's last, arbitrarily


def _no_connector(s: Stream) -> None:
    _drop_config("kv_role")(s)
    _drop_request_key("kv_transfer")(s)


def _no_batch_queue_steps(s: Stream) -> None:
    c = _config(s)
    if not c.get("async_scheduling") and c.get("pipeline_parallel_size", 1) <= 1:
        c.pop("async_ready_steps", None)


def _no_async(s: Stream) -> None:
    _config(s).pop("async_scheduling", None)
    _no_batch_queue_steps(s)


def _no_pipeline(s: Stream) -> None:
    _config(s).pop("pipeline_parallel_size", None)
    _no_batch_queue_steps(s)


def _pool_for_one_request(s: Stream) -> None:
    """vLLM's start-up check: the pool holds one request of max_model_len."""
    c = _config(s)
    if "num_gpu_blocks" in c or "kv_cache_memory_bytes" not in c:
        c["num_gpu_blocks"] = max(c.get("num_gpu_blocks", 64),
                                  -(-c.get("max_model_len", 256) // c.get("block_size", 16)))


def _no_memory_sizing(s: Stream) -> None:
    c = _config(s)
    if c.pop("kv_cache_memory_bytes", None) is not None:
        block = c.get("block_size", 16)
        c["num_gpu_blocks"] = max(64, -(-c.get("max_model_len", 256) // block))


STRIP: dict[str, Callable[[Stream], None]] = {
    "chunked_prefill": _no_chunked_prefill,
    "long_prefill_threshold": _drop_config("long_prefill_token_threshold"),
    "prefix_caching": _no_prefix_caching,
    "prefix_cache_reset": lambda s: s.pop("reset_prefix_cache_steps", None),
    "cache_salt": _drop_request_key("cache_salt"),
    "eos": _no_eos,
    "eos_per_request": _one_eos,
    "model_len_stop": _no_model_len_stop,
    "stop_tokens": _no_stop_tokens,
    "abort": _drop_request_key("abort_step"),
    "priority": _no_priority,
    "prompt_logprobs": _drop_request_key("prompt_logprobs"),
    "spec_decode": _no_spec_decode,
    "hybrid": lambda s: (_drop_config("kv_cache_groups")(s), _pool_for_one_request(s)),
    "lora": _no_lora,
    "structured_output": _drop_request_key("structured_output"),
    "multimodal": _no_multimodal,
    "pooling": _no_pooling,
    "kv_connector": _no_connector,
    "async_scheduling": _no_async,
    "pipeline_parallel": _no_pipeline,
    "memory_sizing": _no_memory_sizing,
    "stats": _drop_config("log_stats"),
    "kv_events": _drop_config("kv_cache_events"),
}


#: Features an engine may have always on (it cannot turn them off), and how a stream
#: turns them on.
TURN_ON: dict[str, Callable[[Stream], None]] = {
    "prefix_caching": lambda s: _config(s).__setitem__("enable_prefix_caching", True),
    "chunked_prefill": lambda s: _config(s).__setitem__("enable_chunked_prefill", True),
}


def _no_stop_token_at_eos(s: Stream) -> None:
    """A request that stops at a stop token that is also its EOS stops there by EOS alone
    (vLLM checks the EOS first): its stop tokens go."""
    mml = _config(s).get("max_model_len", 256)
    for r in _requests(s):
        if _stop_kind(r, mml) == "stop_token" and not r.get("ignore_eos") \
                and r["output"][_stop_end(r, mml) - 1] == r.get("eos_token_id"):
            r.pop("stop_token_ids")


#: Features a later step can bring back, and how they are taken out again: the one EOS
#: (:func:`_one_eos`) can fall on a stop token kept because none fired.
RESTRIP: dict[str, Callable[[Stream], None]] = {"stop_tokens": _no_stop_token_at_eos}


#: The order features are taken out in: the vocabulary's, but a grammar first, so that the
#: one EOS's stand-ins avoid only the tokens of a grammar that stays (:func:`_one_eos`).
STRIP_ORDER = ("structured_output",) + tuple(f for f in FEATURES if f != "structured_output")


def fit(stream: Stream, declared: Iterable[str], always_on: Iterable[str] = ()) -> Stream:
    """The stream (its JSON) with every feature ``declared`` lacks taken out, and those the
    engine has ``always_on`` turned on; a copy."""
    have = set(declared)
    out = copy.deepcopy(stream)
    for name in always_on:
        TURN_ON[name](out)
    for name in STRIP_ORDER:
        if _lacks(have, name) and USES[name](out):
            STRIP[name](out)
    for name, strip in RESTRIP.items():
        if _lacks(have, name) and USES[name](out):
            strip(out)
    return _pool_large_enough(out)


def _lacks(have: set[str], name: str) -> bool:
    """Whether an engine declaring ``have`` lacks the feature (or one it needs)."""
    return name not in have or NEEDS.get(name, name) not in have


def fit_for(stream: Stream, engine) -> Stream:
    """The stream (its JSON) inside the features ``engine`` declares, and with those it has
    always on; itself when the engine declares none."""
    declared = getattr(engine, "features", None)
    if declared is None:
        return stream
    return fit(stream, declared, getattr(engine, "always_on", ()))


def _pool_large_enough(s: Stream) -> Stream:
    """A larger token budget (chunked prefill taken out) can make a window group reserve
    more pages per request than the pool holds: the pool then grows to vLLM's minimum."""
    try:
        parse_stream(s)
    except StreamError as exc:
        for error in exc.errors:
            found = re.match(r"config\.num_gpu_blocks: must be >= (\d+)", error)
            if found and "num_gpu_blocks" in _config(s):
                _config(s)["num_gpu_blocks"] = int(found.group(1))
    return s
