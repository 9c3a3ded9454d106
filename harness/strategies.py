"""Hypothesis strategies for request streams.

Every strategy here generates plain JSON-able stream dicts, the format that
:func:`harness.stream.parse_stream` accepts, and every value it generates is a
*valid* stream: the rules of ``harness.stream`` (``_check_config`` and
``_check_stream``) are built into the draws, nothing is filtered away.  A
generated stream can therefore be written out as a fixture, pinned with
``@example`` and replayed offline as it is.

Streams are small on purpose (a few requests, models of at most a few dozen
tokens, token ids from a small alphabet) so that one run takes milliseconds
in the reference and shared prefixes, stop tokens and draft matches happen by
themselves.

Public strategies:

* :func:`configs` -- engine configs; any field can be fixed or drawn from a
  strategy of your own.
* :func:`streams` -- streams for a config, with knobs that switch features
  (shared prefixes, stop rules, aborts, salts, drafts, ...) on or off.
* Area-focused variants: :func:`preemption_streams`,
  :func:`prefix_cache_streams`, :func:`chunked_prefill_streams`,
  :func:`spec_decode_streams`, :func:`stop_and_abort_streams`;
* targeted variants for rules that need a rare combination (the rule report,
  ``harness.reach``, shows they are needed): :func:`crowd_streams` (up to 72
  requests, ties), :func:`set_aside_streams`, :func:`priority_victim_streams`;
* :func:`hybrid_streams`, for models with several KV cache groups
  (:func:`kv_cache_groups` draws them); :func:`window_hit_streams`, their
  prefix hits after windows have slid; :func:`draft_window_streams`, drafts
  that decide their pages;
* :func:`lora_streams` (LoRA adapters), :func:`grammar_streams`
  (structured output) and :func:`mm_streams` (images), as servers send them;
  :func:`encoder_pressure_streams`, :func:`encoder_preemption_streams` and
  :func:`mm_hash_streams` for the encoder cache's and the image hashes' rarer rules;
* :func:`repeated_image_streams`, :func:`encoder_handoff_streams`,
  :func:`connector_idle_streams` and :func:`passed_over_victim_streams` for rules of
  later releases that the others never decide;
* :func:`any_stream`, which mixes all of them.

Shrinking, in general: fewer requests, shorter prompts and outputs, earlier
arrivals, features switched off (no drafts, no aborts, no salt, no prompt
logprobs, no resets), the first entry of every choice list and the lower
bound of every integer range.  Each strategy's docstring says where its own
values shrink to.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

from hypothesis import strategies as _hypothesis_strategies
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from harness.model import accepted_prefix
from harness.paths import MODELS_DIR
from reference import kv_sizing
from harness.stream import (Config, KVCacheGroup, RequestSpec, StreamError, kv_cache_layout,
                            max_pages_per_request, parse_drawn_stream, shape_errors)

__all__ = [
    "STOP_MODES", "configs", "streams", "preemption_streams", "prefix_cache_streams",
    "chunked_prefill_streams", "spec_decode_streams", "stop_and_abort_streams",
    "crowd_streams", "set_aside_streams", "set_aside_threshold_streams",
    "priority_victim_streams", "priority_victim_draft_streams", "hybrid_streams",
    "window_hit_streams", "draft_window_streams", "lora_streams", "grammar_streams",
    "mm_streams", "encoder_pressure_streams", "encoder_preemption_streams", "mm_hash_streams",
    "repeated_image_streams", "encoder_handoff_streams", "connector_idle_streams",
    "passed_over_victim_streams", "kv_cache_groups", "any_stream", "request_ids",
]

# ---------------------------------------------------------------------------
# Strategies built once per argument list
# ---------------------------------------------------------------------------

#: Distinct argument lists kept per constructor before its memo starts afresh.
_MEMO_SIZE = 4096
_ATOMS = frozenset((bool, int, float, str, bytes, type(None)))


def _memo_key(value: Any) -> Any:
    """A key equal only for arguments that build the same strategy: atoms keyed with their
    type (``1`` and ``True`` sample differently), lists and tuples of keys, strategies by
    identity; None for anything else (a dict, a function), which is built afresh."""
    kind = type(value)
    if kind in _ATOMS:
        return kind, value
    if kind is list or kind is tuple:
        keys = []
        for v in value:
            key = _memo_key(v)
            if key is None:
                return None
            keys.append(key)
        return kind, tuple(keys)
    if isinstance(value, SearchStrategy):
        return value  # hashed by identity
    return None


def _memoized(make: Callable[..., SearchStrategy]) -> Callable[..., SearchStrategy]:
    """``make``, returning the strategy it built before for equal arguments.

    Most strategies here are built inside a draw, from bounds drawn a moment before,
    and a stream draws about two hundred of them: building one (and validating it and
    working out its label on its first draw) costs more than the draw.  hypothesis
    keeps such a cache too, but its look-up costs about as much as building.  The
    strategy handed back is the one hypothesis would build, with the same label, so
    the values a seed draws do not change."""
    made: dict[Any, SearchStrategy] = {}

    @functools.wraps(make)
    def cached(*args: Any, **kwargs: Any) -> SearchStrategy:
        if not kwargs and all(type(a) is int for a in args):
            key: Any = args  # integers(a, b): the common case, keyed cheaply
        else:
            key = _memo_key((args, tuple(sorted(kwargs.items()))))
        if key is None:
            return make(*args, **kwargs)
        strategy = made.get(key)
        if strategy is None:
            if len(made) >= _MEMO_SIZE:
                made.clear()
            strategy = made[key] = make(*args, **kwargs)
        return strategy
    return cached


#: ``hypothesis.strategies`` with the constructors this module calls inside its draws
#: memoized (:func:`_memoized`); everything else is hypothesis's own.
st = types.SimpleNamespace(**{name: getattr(_hypothesis_strategies, name)
                              for name in _hypothesis_strategies.__all__})
for _name in ("binary", "booleans", "integers", "just", "lists", "none", "one_of",
              "sampled_from"):
    setattr(st, _name, _memoized(getattr(_hypothesis_strategies, _name)))


#: Token ids are drawn from ``range(vocab_size)``; small, so that prefixes,
#: stop tokens and drafts meet each other often.
DEFAULT_VOCAB_SIZE = 21
DEFAULT_MAX_STEPS = 400
DEFAULT_MODEL = "qwen2.5-0.5b"

#: How a request is meant to stop (the first is what shrinking goes to):
#: ``script_end`` -- its output script is the whole answer (max_tokens unset);
#: ``max_tokens`` -- max_tokens is hit before the script ends;
#: ``eos`` -- its EOS token is emitted; ``stop_token`` -- one of its
#: stop_token_ids is emitted; ``ignore_eos`` -- EOS tokens are emitted but
#: ignored, the script or max_tokens ends it; ``max_model_len`` -- prompt plus
#: outputs reach max_model_len while max_tokens would allow more.
STOP_MODES = ("script_end", "max_tokens", "eos", "stop_token", "ignore_eos", "max_model_len")

_CONFIG_FIELDS = {f for f in Config.__dataclass_fields__}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _one_in(draw, n: int) -> bool:
    """True one time in ``n``; shrinks to False (the feature left out)."""
    return draw(st.integers(0, n - 1)) == n - 1


@_memoized
@st.composite
def _rarely(draw, rare: SearchStrategy, usual: SearchStrategy, one_in: int = 8) -> Any:
    """A value of ``rare`` one time in ``one_in``, else of ``usual``; shrinks to ``usual``."""
    return draw(rare) if _one_in(draw, one_in) else draw(usual)


def _value(draw, value: Any) -> Any:
    """An override is either a strategy (drawn from) or a plain value (used as is)."""
    return draw(value) if isinstance(value, SearchStrategy) else value


# ---------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------

@_memoized
@st.composite
def configs(draw, **overrides: Any) -> dict[str, Any]:
    """A valid engine config dict (every field of :class:`harness.stream.Config`).

    Each keyword names a config field and gives either a plain value (used as
    it is) or a strategy (drawn from); fields not named are drawn so that the
    whole config is valid whatever the named ones are, as far as possible:
    ``num_gpu_blocks`` is at least ``ceil(max_model_len / block_size)`` (and
    2), ``max_num_batched_tokens`` is at least ``max_num_seqs``, and at least
    ``max_model_len`` when chunked prefill is off.  Two extra keywords shape
    the derived sizes: ``spare_blocks`` (pages beyond the minimum pool;
    default ``1 .. 2 * minimum``, and 0 one time in 8) and ``budget`` (a
    strategy or value for ``max_num_batched_tokens`` that is raised to the
    rules' minimum).
    Overrides that contradict each other raise ``InvalidArgument``.

    The minimum pool is legal but holds one page less than a max_model_len
    request needs (page 0 is the null page), so a request that grows that far
    alone can never be scheduled again and the run ends at ``max_steps``, in
    vLLM as in the reference; hence the minimum is drawn only now and then.

    One config in eight without ``kv_cache_groups`` or a given pool gives the pool as
    ``kv_cache_memory_bytes`` instead: the same pages' bytes plus less than a page.

    Shrinks towards: block_size 4, max_model_len 8, chunked prefill and prefix
    caching on, 1 seat, the smallest legal budget, one spare page, no
    long-prefill threshold, fcfs, no speculative decoding, ngram, num_gpu_blocks.
    """
    unknown = set(overrides) - _CONFIG_FIELDS - {"spare_blocks", "budget", "hybrid"}
    if unknown:
        raise InvalidArgument(f"configs(): unknown field(s) {sorted(unknown)}")

    def pick(name: str, default: SearchStrategy) -> Any:
        return _value(draw, overrides[name]) if name in overrides else draw(default)

    block_size = pick("block_size", st.sampled_from([4, 2, 8, 16]))
    max_model_len = pick("max_model_len", st.integers(8, 48))
    chunked = pick("enable_chunked_prefill", st.sampled_from([True, False]))
    caching = pick("enable_prefix_caching", st.sampled_from([True, False]))
    max_num_seqs = pick("max_num_seqs", st.integers(1, 6))
    min_budget = max(max_num_seqs, 1 if chunked else max_model_len)
    if "max_num_batched_tokens" in overrides:
        budget = _value(draw, overrides["max_num_batched_tokens"])
    elif "budget" in overrides:
        budget = max(min_budget, _value(draw, overrides["budget"]))
    else:
        budget = draw(st.integers(min_budget, max(min_budget, 2 * max_model_len)))
    spare = None
    if "num_gpu_blocks" not in overrides:
        spare = (_value(draw, overrides["spare_blocks"]) if "spare_blocks" in overrides
                 else draw(_rarely(st.just(0), st.integers(1, 2 * max(2, _cdiv(
                     max_model_len, block_size))))))
    threshold = pick("long_prefill_token_threshold",
                     st.one_of(st.just(0), st.integers(1, max_model_len)))
    policy = pick("policy", st.sampled_from(["fcfs", "priority"]))
    num_spec = pick("num_speculative_tokens", st.one_of(st.just(0), st.integers(1, 4)))
    method = pick("speculative_method", st.sampled_from(["ngram", "eagle"]))
    if "kv_cache_groups" in overrides:
        groups = _value(draw, overrides["kv_cache_groups"])
    elif _value(draw, overrides.get("hybrid", False)):
        groups = draw(kv_cache_groups(block_size, caching,
                                      eagle=num_spec > 0 and method == "eagle"))
    else:
        groups = None
    if spare is None:
        num_blocks = _value(draw, overrides["num_gpu_blocks"])
    else:
        num_blocks = max(2, _min_pool(groups, block_size, max_model_len, budget)) + spare
    config = {
        "block_size": block_size,
        "num_gpu_blocks": num_blocks,
        "max_num_batched_tokens": budget,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": caching,
        "long_prefill_token_threshold": threshold,
        "policy": policy,
        "num_speculative_tokens": num_spec,
        "speculative_method": method,
        "model": _value(draw, overrides.get("model", DEFAULT_MODEL)),
        "max_steps": _value(draw, overrides.get("max_steps", DEFAULT_MAX_STEPS)),
    }
    if groups is not None:
        config["kv_cache_groups"] = groups
    max_loras = _value(draw, overrides.get("max_loras"))
    if max_loras is not None:
        config["max_loras"] = max_loras
    if groups is None and spare is not None and _one_in(draw, 8):
        # The pool as start-up sizes it from the worker's memory report: the same pages,
        # and up to a page's worth of bytes that make none.
        page = kv_sizing.ModelShape.load(MODELS_DIR / config["model"]).page_size_bytes_all_layers(
            block_size)
        config["kv_cache_memory_bytes"] = (config.pop("num_gpu_blocks") * page
                                           + draw(st.integers(0, page - 1)))
    # The fields that the overrides give, or size (budget and spare_blocks).
    given = set(overrides)
    given |= {"max_num_batched_tokens"} if "budget" in given else set()
    given |= {"num_gpu_blocks", "kv_cache_memory_bytes"} if "spare_blocks" in given else set()
    _check_config_dict(config, pinned=given & set(config))
    return config


def _min_pool(groups: list[dict[str, Any]] | None, block_size: int, max_model_len: int,
              budget: int) -> int:
    """The smallest pool the stream rules allow (one max_model_len request in every group)."""
    if groups is None:
        return _cdiv(max_model_len, block_size)
    c = Config(block_size=block_size, max_model_len=max_model_len,
               max_num_batched_tokens=budget)
    return sum(max_pages_per_request(KVCacheGroup(**g), c) for g in groups)


@_memoized
@st.composite
def kv_cache_groups(draw, block_size: int, caching: bool, eagle: bool = False
                    ) -> list[dict[str, Any]]:
    """The KV cache groups of a hybrid model, valid for the config (see ``harness.stream``).

    With prefix caching on: full-attention groups plus groups of one other
    type with one parameter, full ones first or last (vLLM 0.11.0's hybrid
    coordinator), or a single group of any attention type; no Mamba (0.11.0
    turns caching off for it), no chunked local attention with eagle.  With
    caching off, any mix in any order, Mamba included.  Windows and chunks are
    1-4 pages long, sometimes not a whole number of pages, so they slide within
    the short requests of a stream.
    Shrinks towards: one full group followed by one sliding-window group.
    """
    others = ["sliding_window", "chunked_local"] + ([] if caching else ["mamba"])
    if caching and eagle:
        others.remove("chunked_local")
    shape = draw(st.sampled_from(["full_and_other", "one_group"] + ([] if caching else ["mixed"])))
    if shape == "one_group":
        return [_group(draw, draw(st.sampled_from(others)), block_size)]
    if shape == "mixed":
        kinds = draw(st.lists(st.sampled_from(["full", "sliding_window", "chunked_local", "mamba"]),
                              min_size=2, max_size=5))
        return [_group(draw, kind, block_size) for kind in kinds]
    other = _group(draw, draw(st.sampled_from(others)), block_size)
    full = [{"type": "full"}] * draw(st.integers(1, 2))
    rest = [other] * draw(st.integers(1, 3))
    return full + rest if not _one_in(draw, 3) else rest + full


def _group(draw, kind: str, block_size: int) -> dict[str, Any]:
    if kind == "sliding_window":
        # sliding_window - 1 a whole number of pages half the time: the edge of the hit rule.
        pages = draw(st.integers(0, 4))
        edge = (draw(st.integers(0, block_size - 1)) if _one_in(draw, 2)
                else draw(st.sampled_from([1, 0, 2])))
        return {"type": kind, "sliding_window": max(1, pages * block_size + edge)}
    if kind == "chunked_local":
        pages = draw(st.integers(1, 4))
        odd = draw(_rarely(st.integers(1, max(1, block_size - 1)), st.just(0), one_in=4))
        return {"type": kind, "attention_chunk_size": pages * block_size + odd}
    return {"type": kind}


def _check_config_dict(config: dict[str, Any], pinned: set[str]) -> None:
    """Validate a config with a one-token dummy request; bad overrides raise InvalidArgument.

    The schema's walk covers the fields the caller ``pinned``: the fields drawn here are
    within its bounds by construction (tests/test_strategies.py parses whole configs and
    streams of every strategy), and the walk over a whole config would cost a few times
    more than the rest of the check.  Every cross-field rule is checked.
    """
    try:
        errors = _pinned_shape_errors({k: config[k] for k in sorted(pinned)})
        if errors:
            raise StreamError(errors)
        parse_drawn_stream({"config": config, "requests": _ONE_TOKEN_REQUEST})
    except StreamError as exc:
        raise InvalidArgument(f"configs(): overrides give an invalid config: {exc}") from None


#: The dummy request a drawn config is checked with (read, never changed).
_ONE_TOKEN_REQUEST = [{"id": "x", "prompt": [0], "output": [0], "max_tokens": 1}]
#: The schema's answers for sets of pinned fields of plain values (see _memo_key).
_PINNED_ANSWERS: dict[Any, list[str]] = {}


def _pinned_shape_errors(fields: dict[str, Any]) -> list[str]:
    """The schema's complaints about the pinned fields: a strategy pins the same few
    values draw after draw, so each set of plain values is walked once."""
    key = _memo_key(tuple(fields.items()))
    errors = _PINNED_ANSWERS.get(key) if key is not None else None
    if errors is None:
        errors = shape_errors({"config": fields, "requests": _ONE_TOKEN_REQUEST})
        if key is not None and len(_PINNED_ANSWERS) < _MEMO_SIZE:
            _PINNED_ANSWERS[key] = errors
    return list(errors)


# ---------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------

def _tokens(draw, n: int, vocab: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """``n`` tokens from the alphabet minus ``avoid``.

    Drawn as ``n`` bytes in one draw (a token per draw makes generation several
    times slower); shrinks like bytes do, towards the smallest allowed token.
    """
    if n <= 0:
        return []
    allowed = [t for t in range(vocab) if t not in avoid]
    raw = draw(st.binary(min_size=n, max_size=n))
    return [allowed[b % len(allowed)] for b in raw]


def _text(draw, n: int, vocab: int = DEFAULT_VOCAB_SIZE) -> list[int]:
    """``n`` text tokens of a multimodal prompt: never token 0, the image token."""
    return [1 + t % (vocab - 1) for t in _tokens(draw, n, vocab)]


def _other_token(draw, token: int, vocab: int) -> int:
    """A token different from ``token`` (shrinks towards ``token + 1``)."""
    return (token + draw(st.integers(1, vocab - 1))) % vocab


@st.composite
def _prefix_pool(draw, config: dict[str, Any], vocab: int) -> list[list[int]]:
    """1-3 shared prefixes: whole pages, or whole pages plus a partial page."""
    bs, limit = config["block_size"], config["max_model_len"] - 1
    pool = []
    for _ in range(draw(st.integers(1, 3))):
        pages = draw(st.integers(1, max(1, min(3, (limit - 1) // bs))))
        partial = draw(st.sampled_from([0, 0, 1, bs // 2, bs - 1]))
        length = max(1, min(pages * bs + partial, limit - 1))
        pool.append(_tokens(draw, length, vocab))
    return pool


def _draw_prompt(draw, config: dict[str, Any], earlier: list[dict[str, Any]],
                 prefixes: list[list[int]], vocab: int, min_len: int, max_len: int,
                 cut_earlier: bool = False) -> list[int]:
    """A fresh prompt, a shared prefix plus a suffix, an earlier request's prompt+output,
    or (``cut_earlier``) the first tokens of an earlier request's prompt+output."""
    kinds = ["fresh"]
    if prefixes:
        kinds.append("prefix")
    if prefixes and earlier:
        kinds.append("extends_earlier")
    if cut_earlier and earlier:
        kinds.append("cuts_earlier")
    kind = draw(st.sampled_from(kinds))
    limit = config["max_model_len"] - 1  # a prompt must be shorter than max_model_len
    if kind == "fresh":
        return _tokens(draw, draw(st.integers(min_len, max_len)), vocab)
    if kind == "cuts_earlier":  # its hit ends where the earlier request's window had slid on
        other = draw(st.sampled_from(earlier))
        whole = (other["prompt"] + other["output"])[:limit]
        return whole[:draw(st.integers(1, len(whole)))]
    if kind == "prefix":
        head = draw(st.sampled_from(prefixes))
    else:  # the prompt and some outputs of an earlier request: a hit on output pages
        other = draw(st.sampled_from(earlier))
        head = other["prompt"] + other["output"][:draw(st.integers(0, len(other["output"])))]
    head = head[:limit]
    tail = draw(st.integers(0, max(0, min(max_len, limit) - len(head))))
    prompt = head + _tokens(draw, tail, vocab)
    return prompt or _tokens(draw, 1, vocab)


def _draw_output(draw, config: dict[str, Any], prompt_len: int, vocab: int,
                 stop_modes: tuple[str, ...], max_output_len: int) -> dict[str, Any]:
    """The output script and stop fields of one request, for a drawn stop mode.

    Tokens that would stop the request too early are kept out of the script
    before the intended stop position, so the intended rule is the one that
    fires (unless an abort comes first).
    """
    room = config["max_model_len"] - prompt_len  # outputs until max_model_len stops it
    modes = list(stop_modes)
    if room < 2:  # EOS/stop token before the model-length stop needs 2 output slots
        modes = [m for m in modes if m not in ("eos", "stop_token")] or ["script_end"]
    mode = draw(st.sampled_from(modes))
    cap = max(1, min(max_output_len, room))
    fields: dict[str, Any] = {}
    eos = draw(st.one_of(st.none(), st.integers(0, vocab - 1)))
    stops = draw(st.lists(st.integers(0, vocab - 1), max_size=2, unique=True))
    if mode in ("eos", "ignore_eos") and eos is None:
        eos = draw(st.integers(0, vocab - 1))
    if mode == "stop_token" and not stops:
        stops = [draw(st.integers(0, vocab - 1))]
    if mode in ("eos", "ignore_eos"):
        stops = [t for t in stops if t != eos]  # EOS itself must fire, or be ignored
    if mode == "stop_token" and eos in stops:
        eos = None  # the stop token, not EOS, must fire
    ignore_eos = mode == "ignore_eos"
    # Tokens that stop the request; at least one token must stop nothing, to
    # write the script before the stop with (only a tiny vocab_size needs this).
    avoid = set(stops) | ({eos} if eos is not None and not ignore_eos else set())
    if len(avoid) >= vocab:
        if mode == "stop_token":
            eos = None
            stops = stops[:1]
        else:
            stops = []
        avoid = set(stops) | ({eos} if eos is not None and not ignore_eos else set())
    avoid_fs = frozenset(avoid)

    if mode in ("eos", "stop_token"):
        k = draw(st.integers(0, min(cap, room - 1) - 1))  # the stop token's index
        stop = eos if mode == "eos" else draw(st.sampled_from(stops))
        output = _tokens(draw, k, vocab, avoid_fs) + [stop]
        output += _tokens(draw, draw(st.integers(0, 3)), vocab)
        if draw(st.booleans()):
            fields["max_tokens"] = draw(st.integers(k + 2, k + 12))
    elif mode == "max_tokens":
        m = draw(st.integers(1, cap))
        output = _tokens(draw, m + draw(st.integers(1, 4)), vocab)
        output[:m] = _tokens(draw, m, vocab, avoid_fs)
        fields["max_tokens"] = m
    elif mode == "max_model_len":
        output = _tokens(draw, room, vocab, avoid_fs)
        output += _tokens(draw, draw(st.integers(1, 3)), vocab)  # never reached
        if draw(st.booleans()):
            fields["max_tokens"] = room + draw(st.integers(1, 8))
    elif mode == "ignore_eos":
        n = draw(st.integers(1, cap))
        output = _tokens(draw, n, vocab, avoid_fs)
        for _ in range(draw(st.integers(1, 2))):  # EOS in the script, to be ignored
            output[draw(st.integers(0, n - 1))] = eos
        if draw(st.booleans()) and n > 1:
            fields["max_tokens"] = draw(st.integers(1, n))
    else:  # script_end
        output = _tokens(draw, draw(st.integers(1, cap)), vocab, avoid_fs)

    if eos is not None:
        fields["eos_token_id"] = eos
    if stops:
        fields["stop_token_ids"] = stops
    if ignore_eos:
        fields["ignore_eos"] = True
    fields["output"] = output
    return fields


def _draw_drafts(draw, output: list[int], stop_index: int, num_spec: int,
                 vocab: int) -> list[list[int]]:
    """Draft lists taken from the request's own future output, partly changed.

    The runner hands a request its next draft list each time it emits.  The
    strategy follows the emissions it expects (one token at the end of the
    prefill, then ``accepted + 1`` per step) and builds each list from the
    output the request is expected to need next: ``accepted`` leading tokens
    are right, the next one is changed, the rest copied.  Budget cuts and
    preemptions move the real emissions, so some lists end up checked against
    other positions -- still valid, just less right.  Shrinks towards no
    drafts, then short all-wrong lists.
    """
    drafts: list[list[int]] = []
    n = 1  # outputs after the prefill's emission
    while n <= stop_index and len(drafts) < 12:
        length = draw(st.integers(0, num_spec))
        target = output[n:n + length]
        target += [0] * (length - len(target))
        right = draw(st.integers(0, length))
        draft = list(target)
        if right < length:
            draft[right] = _other_token(draw, target[right], vocab)
            for j in range(right + 1, length):
                if _one_in(draw, 4):
                    draft[j] = _other_token(draw, target[j], vocab)
        drafts.append(draft)
        n += accepted_prefix(draft, output[n:n + length]) + 1
    return drafts


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


# ---------------------------------------------------------------------------
# Area-focused variants
# ---------------------------------------------------------------------------

def _with(defaults: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    return {**defaults, **knobs}


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


# ---------------------------------------------------------------------------
# Targeted variants: the rules that need a rare combination
# ---------------------------------------------------------------------------

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


def _hybrid_configs() -> SearchStrategy[dict[str, Any]]:
    return configs(hybrid=True, block_size=st.sampled_from([4, 2, 8]),
                   max_model_len=st.integers(16, 48),
                   enable_prefix_caching=st.sampled_from([True, False]),
                   budget=_rarely(st.integers(1, 48), st.integers(2, 12), one_in=2),
                   spare_blocks=_rarely(st.integers(4, 16), st.integers(0, 3), one_in=3),
                   max_num_seqs=st.integers(1, 6),
                   num_speculative_tokens=st.one_of(st.just(0), st.integers(1, 3)))


def hybrid_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Hybrid models: several KV cache groups (see :func:`kv_cache_groups`).

    Prefix caching on in half of the configs, drafts in half; small budgets in half,
    so that prompts are prefilled in chunks and windows slide within a
    prefill; pools of 0-3 spare pages most of the time, so that requests
    preempt each other while their windows have freed pages; shared prefixes
    and prompts that extend an earlier request's output in every stream, so
    that hits are searched from the right and must agree across groups;
    drafts (Mamba's extra pages, eagle's extra window page, accepted drafts
    that leave a short window before they are cached).  ``knobs`` go to
    :func:`streams`.
    Shrinks towards: a full and a sliding-window group, two requests at step 0.
    """
    return streams(**_with(dict(config=_hybrid_configs(), min_requests=2, max_requests=6,
                                shared_prefixes="always", max_arrival_step=6,
                                max_prompt_len=40, max_output_len=20), knobs))


def window_hit_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Prefix hits on hybrid models whose windows have slid: full-attention groups plus
    sliding-window (or, one time in four, chunked-local) groups, prefix caching on.

    Requests arrive one after another over 10 steps and reuse each other's
    tokens -- shared prefixes, an earlier prompt + output, or its first tokens
    -- in a pool of 0-3 spare pages: the pages a window let go of mid-request
    are evicted first, so later hits must be found from the right, and the
    full-attention hit is often longer than the window's and is cut to it.
    Half of the windows end on a page edge (``sliding_window - 1`` a whole
    number of pages); ngram drafts in half of the configs.
    ``knobs`` go to :func:`streams`.
    Shrinks towards: one full and one sliding-window group, three requests at step 0.
    """
    config = _window_hit_configs()
    return streams(**_with(dict(config=config, min_requests=3, max_requests=8,
                                shared_prefixes="always", cut_earlier=True, max_arrival_step=10,
                                max_prompt_len=40, max_output_len=12, aborts=False,
                                cache_salts=False, prompt_logprobs=False, resets=False), knobs))


@st.composite
def _window_hit_configs(draw) -> dict[str, Any]:
    block_size = draw(st.sampled_from([4, 2, 8]))
    kind = draw(_rarely(st.just("chunked_local"), st.just("sliding_window"), one_in=4))
    other = _group(draw, kind, block_size)
    if kind == "sliding_window" and _one_in(draw, 2):  # sliding_window - 1 on a page edge
        other = {**other, "sliding_window": draw(st.integers(0, 4)) * block_size + 1}
    groups = [{"type": "full"}] * draw(st.integers(1, 2)) + [other] * draw(st.integers(1, 2))
    if _one_in(draw, 4):
        groups.reverse()
    return draw(configs(block_size=block_size, max_model_len=st.integers(20, 48),
                        enable_prefix_caching=True, enable_chunked_prefill=True,
                        max_num_seqs=st.integers(1, 4), budget=st.integers(4, 24),
                        spare_blocks=st.integers(0, 3), kv_cache_groups=groups,
                        num_speculative_tokens=st.one_of(st.just(0), st.integers(1, 3)),
                        speculative_method="ngram"))


@st.composite
def _draft_window_configs(draw) -> dict[str, Any]:
    block_size = draw(st.sampled_from([4, 2, 8]))
    if _one_in(draw, 3):  # Mamba: its state pages, one per draft
        groups = [{"type": "mamba"}, {"type": "full"}]
        if _one_in(draw, 2):
            groups.reverse()
        caching = False
    else:  # a window shorter than the drafts that fill its pages
        groups = [{"type": "full"}, {"type": "sliding_window",
                                     "sliding_window": draw(st.integers(1, 4))}]
        caching = True
    return draw(configs(block_size=block_size, max_model_len=st.integers(16, 48),
                        enable_prefix_caching=caching, kv_cache_groups=groups,
                        budget=st.integers(8, 32), max_num_seqs=st.integers(1, 4),
                        num_speculative_tokens=st.integers(2, 4), speculative_method="ngram"))


def _right_drafts(output: list[int], stop_index: int, num_spec: int) -> list[list[int]]:
    """Draft lists that are all accepted: each is the request's next outputs."""
    drafts, n = [], 1
    while n <= stop_index and len(drafts) < 12:
        drafts.append(list(output[n:n + num_spec]))
        n += len(drafts[-1]) + 1
    return drafts


@st.composite
def draft_window_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Speculative decoding on hybrid models, where drafts decide pages: a sliding window
    of 1-4 tokens (prefix caching on), shorter than the accepted drafts, or (one config
    in three) a Mamba group, which keeps one state page per speculative token.

    With a window that short, a page filled by accepted drafts leaves the window
    before it is cached, and vLLM 0.11.0 indexes the null page in its place
    (quirks.NULL_PAGE_CACHED): such streams end in the crash both engines raise.
    Every request carries drafts; in three requests of four they are all right.
    ``knobs`` go to :func:`streams`.
    Shrinks towards: a full group and a 1-token window, two drafts, one request.
    """
    data = draw(streams(**_with(dict(config=_draft_window_configs(), min_requests=1,
                                     max_requests=4, drafts=True, max_output_len=20,
                                     max_arrival_step=4, aborts=False), knobs)))
    config = data["config"]
    for request in data["requests"]:
        if not _one_in(draw, 4):
            request["drafts"] = _right_drafts(
                request["output"], _spec_of(request).stop_index(config["max_model_len"]),
                config["num_speculative_tokens"])
    return data


def lora_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """LoRA adapters: ``max_loras`` 1-3, three requests in four naming one of four adapters.

    Every stream shares prefixes, so the same tokens arrive under different adapters
    (and under none), whose pages must not be shared; arrivals come in bursts of up to
    3 steps to 2-6 seats, so waiting requests meet full adapter slots and are set
    aside while others behind them run; prefix caching on in three configs of four,
    drafts in a third.  ``knobs`` go to :func:`streams`.
    Shrinks towards: one adapter slot, two requests at step 0.
    """
    config = configs(max_loras=st.integers(1, 3), max_num_seqs=st.integers(2, 6),
                     enable_prefix_caching=_rarely(st.just(False), st.just(True), one_in=4),
                     num_speculative_tokens=_rarely(st.integers(1, 3), st.just(0), one_in=3))
    return streams(**_with(dict(config=config, min_requests=2, max_requests=8,
                                shared_prefixes="always", bursts=3, max_arrival_step=6), knobs))


def grammar_streams(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Structured output: half of the requests wait for a grammar (ready at arrival or
    1-4 steps later) that rejects tokens some of their drafts hold.

    Speculative decoding in half of the configs (so drafts are cut by the grammar and
    the bitmask has a row per draft), LoRA adapters in a quarter, 2-6 seats and
    arrivals over 6 steps, so grammar-constrained requests are new, running and
    resumed in one batch.  ``knobs`` go to :func:`streams`.
    Shrinks towards: no drafts, no LoRA, two requests at step 0.
    """
    config = configs(max_num_seqs=st.integers(2, 6),
                     num_speculative_tokens=st.one_of(st.just(0), st.integers(1, 3)),
                     max_loras=_rarely(st.integers(1, 2), st.none(), one_in=4))
    return streams(**_with(dict(config=config, min_requests=2, max_requests=8, grammars=True,
                                max_arrival_step=6), knobs))


@st.composite
def mm_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Multimodal inputs: prompts holding images (placeholders of 1-8 tokens) that the
    encoder must run on, within its per-step budget and its cache.

    Each stream has one layout of up to 3 placeholders; a request's prompt carries
    those of them that fit inside it, its placeholder tokens all token 0 (the image
    token), and each item one of two content hashes -- so prompts that share a prefix
    share a prefix hit only when their images agree, and the encoder cache shares an
    output between requests with the same image.  Budgets of 1-16 encoder tokens and
    caches of 1-24 tokens as configured (often below the largest item, which
    vLLM raises them to; one time in six left to the token budget), the model's
    largest item above the stream's one time in three, small token budgets so
    prompts are chunked across placeholders, ``disable_chunked_mm_input`` in a third
    of the configs, drafts in a quarter (ngram or eagle), tight pools so requests
    preempt each other.  ``knobs`` go to :func:`streams`.
    Shrinks towards: one 1-token image at the start, chunked multimodal input allowed.
    """
    config = draw(configs(max_model_len=st.integers(12, 40), budget=st.integers(2, 16),
                          max_num_seqs=st.integers(1, 4), spare_blocks=st.integers(0, 6),
                          num_speculative_tokens=_rarely(st.integers(1, 3), st.just(0),
                                                         one_in=4)))
    layout, end = [], 0
    for _ in range(draw(st.integers(1, 3))):
        offset = end + draw(st.integers(0, 6))
        length = draw(st.integers(1, 8))
        if offset + length >= config["max_model_len"] - 1:
            break
        layout.append((offset, length))
        end = offset + length
    if not layout:
        layout = [(0, 1)]
    largest = max(length for _, length in layout)
    budget = config["max_num_batched_tokens"]
    if _one_in(draw, 3) and largest <= budget:
        config["disable_chunked_mm_input"] = True
    for key, most in (("encoder_compute_budget", 16), ("encoder_cache_size", 24)):
        if not _one_in(draw, 6):  # else: the token budget, as vLLM sets it
            config[key] = draw(st.integers(largest, max(largest, most)) | st.integers(1, most))
    if _one_in(draw, 3):  # the model's largest item, above the stream's
        most = budget if config.get("disable_chunked_mm_input") else 16
        config["max_tokens_per_mm_item"] = draw(st.integers(largest, max(largest, most)))
    elif "encoder_compute_budget" not in config and "encoder_cache_size" not in config:
        config["encoder_compute_budget"] = budget
    data = draw(streams(**_with(dict(config=config, min_requests=1, max_requests=6,
                                     shared_prefixes="always", max_arrival_step=6), knobs)))
    for request in data["requests"]:
        items = []
        for n, (offset, length) in enumerate(layout):
            if offset + length > len(request["prompt"]) or _one_in(draw, 5):
                continue
            request["prompt"][offset:offset + length] = [0] * length
            items.append({"offset": offset, "length": length,
                          "hash": f"image{n}-{draw(st.integers(0, 1))}"})
        if items:
            request["mm_inputs"] = items
    return data


@st.composite
def encoder_pressure_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Multimodal inputs under pressure: one or two long images (3-8 tokens) per prompt,
    prefilled over several steps by token budgets of 2-8, encoder caches barely larger
    than the largest image, four different images, and pools with no spare page -- so
    images are evicted in order while others wait, and requests are preempted in the
    middle of a placeholder.  ``disable_chunked_mm_input`` in half of the configs, an
    eagle drafter (which reads one placeholder position past the grant from 0.12.0)
    in a third.  ``knobs`` go to :func:`streams`.
    Shrinks towards: 3-token images, the smallest cache and budget, two requests.
    """
    config = draw(configs(max_model_len=st.integers(24, 48), budget=st.integers(2, 8),
                          max_num_seqs=st.integers(3, 4), spare_blocks=st.just(0),
                          enable_chunked_prefill=True,
                          num_speculative_tokens=_rarely(st.integers(1, 2), st.just(0), one_in=3),
                          speculative_method="eagle"))
    largest = draw(st.integers(3, 8))
    config["encoder_compute_budget"] = largest + draw(st.integers(0, 4))
    config["encoder_cache_size"] = largest + draw(st.integers(0, 2))
    if _one_in(draw, 2) and largest <= config["max_num_batched_tokens"]:
        config["disable_chunked_mm_input"] = True
    data = draw(streams(**_with(dict(config=config, min_requests=2, max_requests=6,
                                     shared_prefixes=False, max_arrival_step=6,
                                     min_prompt_len=largest + 4, max_prompt_len=30,
                                     max_output_len=12), knobs)))
    for request in data["requests"]:
        items, start = [], 0
        for _ in range(draw(st.integers(1, 2))):
            offset = start + draw(st.integers(0, 6))
            length = draw(st.integers(3, largest))
            if offset + length > len(request["prompt"]):
                break
            request["prompt"][offset:offset + length] = [0] * length
            items.append({"offset": offset, "length": length,
                          "hash": f"image{draw(st.integers(0, 3))}"})
            start = offset + length
        if items:
            request["mm_inputs"] = items
    return data

@st.composite
def encoder_preemption_streams(draw, **knobs: Any) -> dict[str, Any]:
    """A request preempted in the middle of its image while another needs the encoder
    cache's room (the bundled mm_preempted_lets_go_of_encoder_output, varied).  The
    first request has a text head of two or three pages and an image (``dog``) at its
    end; the second a head shorter than a page, its image (``cat``) and a short tail.
    Prefills are cut to one page a step, the cache holds one image, and the pool holds
    the first request and one page more, so the second request, the last to join, is
    preempted once its image is encoded but before its placeholder is computed; its
    image must leave the cache, or the first request's image cannot be encoded.  Now and
    then a third request, a spare page, a larger cache or priority scheduling change who
    waits.  ``knobs`` are not used (the requests are built here).
    Shrinks towards: pages of 4, the bundled stream's shape.
    """
    block_size = draw(st.sampled_from([4, 2, 8]))
    length = draw(st.integers(2, 2 * block_size))
    first_text = draw(st.integers(2, 3)) * block_size
    first = {"prompt": _tokens(draw, first_text, DEFAULT_VOCAB_SIZE) + [0] * length,
             "mm_inputs": [{"offset": first_text, "length": length, "hash": "dog"}],
             "output": _tokens(draw, 1, DEFAULT_VOCAB_SIZE)}
    usable = -(-len(first["prompt"]) // block_size)  # the pages of the first prompt
    fits = usable * block_size  # what one request may hold: its output token is not computed
    max_model_len = fits + block_size  # the smallest legal pool is then usable + the null page
    head = draw(st.integers(1, block_size - 1))
    tail = draw(st.integers(0, min(block_size, fits - head - length - 1)))
    second = {"prompt": (_tokens(draw, head, DEFAULT_VOCAB_SIZE) + [0] * length
                         + _tokens(draw, tail, DEFAULT_VOCAB_SIZE)),
              "mm_inputs": [{"offset": head, "length": length, "hash": "cat"}]}
    second["output"] = _tokens(draw, draw(st.integers(1, fits - len(second["prompt"]))),
                               DEFAULT_VOCAB_SIZE)
    requests = [first, second]
    if _one_in(draw, 4):
        requests.append({"prompt": _tokens(draw, draw(st.integers(1, fits - 1)),
                                           DEFAULT_VOCAB_SIZE),
                         "output": _tokens(draw, 1, DEFAULT_VOCAB_SIZE),
                         "arrival_step": draw(st.integers(0, 3))})
    pages = usable + 1 + draw(_rarely(st.just(1), st.just(0), one_in=4))
    config = draw(configs(block_size=block_size, max_model_len=max_model_len,
                          num_gpu_blocks=pages, enable_chunked_prefill=True,
                          enable_prefix_caching=st.booleans(), max_num_seqs=st.integers(2, 3),
                          max_num_batched_tokens=2 * block_size,
                          long_prefill_token_threshold=block_size,
                          policy=st.sampled_from(["fcfs", "priority"]),
                          num_speculative_tokens=0))
    config["encoder_compute_budget"] = length + draw(st.integers(0, 1))
    config["encoder_cache_size"] = length + draw(_rarely(st.integers(1, length - 1),
                                                         st.just(0), one_in=4))
    ids = draw(request_ids(len(requests)))
    for rid, request in zip(ids, requests):
        request["id"] = rid
        if config["policy"] == "priority":
            request["priority"] = draw(st.integers(0, 1))
    return {"config": config, "requests": requests}


@st.composite
def mm_hash_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Prefix hits on prompts with images: a first request whose prompt ends in an
    unfinished page, with an image ending on the page edge before it or two 1-token
    images inside it, and whose outputs complete that page; then 1-3 requests whose
    prompts extend its prompt and outputs, with the same images (or, one time in three,
    another), arriving once it is done -- so the hashes of the page after a placeholder
    and of a page completed by outputs decide the hit.  Prefix caching on.
    ``knobs`` are not used (the requests are built here).
    Shrinks towards: pages of 4, one page and one token, an image ending on the edge.
    """
    block_size = draw(st.sampled_from([4, 2, 8]))
    pages = draw(st.integers(1, 3))
    tail = draw(st.integers(1, max(1, block_size - 1)))
    prompt_len = pages * block_size + tail
    num_outputs = block_size - tail + 1 + draw(st.integers(0, 1))
    max_model_len = prompt_len + num_outputs + block_size + 8
    config = draw(configs(block_size=block_size, max_model_len=max_model_len,
                          enable_prefix_caching=True, enable_chunked_prefill=True,
                          max_num_seqs=st.integers(1, 4), budget=st.integers(8, 32),
                          spare_blocks=st.integers(2, 8), num_speculative_tokens=0))
    config["encoder_compute_budget"] = config["encoder_cache_size"] = 16
    edge = pages * block_size
    if tail >= 2 and draw(st.booleans()):  # two 1-token images in the unfinished page
        first = edge + draw(st.integers(0, tail - 2))
        second = draw(st.integers(first + 1, prompt_len - 1))
        layout = [(first, 1), (second, 1)]
    else:  # an image ending on the page edge
        length = draw(st.integers(1, min(8, edge)))
        layout = [(edge - length, length)]
    prompt = _tokens(draw, prompt_len, DEFAULT_VOCAB_SIZE)
    for offset, length in layout:
        prompt[offset:offset + length] = [0] * length
    images = [{"offset": o, "length": n, "hash": f"image{i}-0"} for i, (o, n) in enumerate(layout)]
    output = _tokens(draw, num_outputs, DEFAULT_VOCAB_SIZE)
    count = draw(st.integers(1, 3))
    ids = draw(request_ids(count + 1))
    requests = [{"id": ids[0], "prompt": prompt, "output": output, "mm_inputs": images}]
    arrivals = sorted(draw(st.lists(st.integers(min(10, num_outputs + 2), 10),
                                    min_size=count, max_size=count)))
    for rid, arrival in zip(ids[1:], arrivals):
        head = prompt + output[:draw(st.integers(0, num_outputs))]
        extra = _tokens(draw, draw(st.integers(0, block_size)), DEFAULT_VOCAB_SIZE)
        mine = [dict(m) for m in images]
        if _one_in(draw, 3):
            changed = draw(st.sampled_from(mine))
            changed["hash"] = changed["hash"][:-1] + "1"
        requests.append({"id": rid, "prompt": (head + extra)[:max_model_len - 2],
                         "output": _tokens(draw, 1, DEFAULT_VOCAB_SIZE), "mm_inputs": mine,
                         "arrival_step": arrival})
    return {"config": config, "requests": requests}


@st.composite
def repeated_image_streams(draw, **knobs: Any) -> dict[str, Any]:
    """One image shown twice in one prompt, while another request's larger image wants the
    encoder cache's room (the bundled held_to_last_occurrence and items_taken_per_request,
    varied).  ``r`` shows image ``x`` (2-4 tokens) twice; ``b``, admitted with it just
    before it, shows ``y``, longer than ``x``; the encoder cache and budget hold ``y`` but
    not both, and each prefill is cut into chunks of 4-8 tokens (the long-prefill
    threshold).  ``r``'s second copy starts in one chunk and ends in the next, and ``b``
    reaches ``y`` in that next step: ``r`` is past its first copy, and whether that lets
    ``x`` be evicted for ``y`` decides who goes on (from 0.29.0 ``r`` holds ``x`` to its
    last copy).  In a third of the streams prefix caching is on and a request ``a`` with
    ``r``'s first pages, the first copy in them, runs first: ``r``'s first copy is a hit
    and only its second takes ``x`` (from 0.23.0 only the items a request took are let
    go of).  One stream in four moves the second copy and ``y`` anywhere.  ``knobs`` are
    not used (the requests are built here).
    Shrinks towards: pages of 4, chunks of 4 tokens, images of 2 and 3 tokens, no ``a``.
    """
    block_size = draw(st.sampled_from([4, 8, 2]))
    x_len = draw(st.integers(2, 4))
    chunk = draw(st.integers(x_len + 2, 8))
    y_len = x_len + draw(st.integers(1, 4))
    cache = y_len + draw(st.integers(0, x_len - 1))  # y fits, x and y together do not
    cached_head = _one_in(draw, 3)
    anywhere = _one_in(draw, 4)

    first = draw(st.integers(1, chunk - 1))  # within r's first chunk
    # Where r's computing starts: 0, or a's whole pages (the first copy in them), a hit.
    start = _cdiv(first + x_len, block_size) * block_size if cached_head else 0
    steps_before = 1 if not cached_head else draw(st.integers(0, 1))  # r's chunks before
    edge = start + (steps_before + 1) * chunk  # where the step that needs y begins
    second = edge - draw(st.integers(1, x_len - 1))  # straddles that edge
    second = max(second, start, first + x_len + 1)
    y_at = (steps_before + 1) * chunk
    if anywhere:
        second += draw(st.integers(0, 2 * chunk))
        y_at = draw(st.integers(1, 3 * chunk))
    prompt = (_text(draw, first) + [0] * x_len + _text(draw, second - first - x_len)
              + [0] * x_len + _text(draw, draw(st.integers(1, 4))))
    r = {"prompt": prompt, "output": _text(draw, draw(st.integers(1, 3))),
         "mm_inputs": [{"offset": first, "length": x_len, "hash": "x"},
                       {"offset": second, "length": x_len, "hash": "x"}]}
    b = {"prompt": _text(draw, y_at) + [0] * y_len + _text(draw, draw(st.integers(1, 4))),
         "output": _text(draw, draw(st.integers(1, 3))),
         "mm_inputs": [{"offset": y_at, "length": y_len, "hash": "y"}]}
    requests = [b, r]
    if cached_head:  # a: r's first pages, done before b and r arrive
        a = {"prompt": prompt[:start], "output": _text(draw, 1),
             "mm_inputs": [{"offset": first, "length": x_len, "hash": "x"}]}
        b["arrival_step"] = r["arrival_step"] = _cdiv(start, chunk) + 2
        requests.insert(0, a)
    longest = max(len(q["prompt"]) + len(q["output"]) for q in requests)
    config = draw(configs(block_size=block_size, max_model_len=longest + block_size,
                          enable_chunked_prefill=True, enable_prefix_caching=cached_head,
                          long_prefill_token_threshold=chunk,
                          max_num_batched_tokens=2 * chunk + draw(st.integers(0, chunk)),
                          max_num_seqs=st.integers(2, 4), spare_blocks=st.integers(4, 12),
                          policy="fcfs", num_speculative_tokens=0))
    config["encoder_cache_size"] = config["encoder_compute_budget"] = cache
    for rid, q in zip(draw(request_ids(len(requests))), requests):
        q["id"] = rid
    return {"config": config, "requests": requests}


@st.composite
def encoder_handoff_streams(draw, **knobs: Any) -> dict[str, Any]:
    """An encoder cache handed from one image to the next under a batch queue (the bundled
    encoder_frees_wait_for_outputs, varied).  ``a`` ends with its image, and step 0
    computes it whole and ``b``'s text up to ``b``'s image, which the next step needs;
    the encoder cache holds either image but not both.  Under async scheduling (or, one
    stream in three, pipeline stages) the next step is scheduled before step 0's outputs
    are in: whether ``a`` has let go of its image by then decides whether ``b``'s image
    fits (from 0.20.0 it waits for the outputs).  One stream in four moves ``b``'s image
    anywhere; the worker is done at once with a drawn share of the steps.  ``knobs`` are
    not used (the requests are built here).
    Shrinks towards: async scheduling, images of 2 tokens, ``a`` all image.
    """

    a_len, b_len = draw(st.integers(2, 5)), draw(st.integers(2, 5))
    cache = max(a_len, b_len) + draw(st.integers(0, min(a_len, b_len) - 1))
    a = {"prompt": _text(draw, draw(st.integers(0, 4))) + [0] * a_len,
         "output": _text(draw, draw(st.integers(1, 3)))}
    a["mm_inputs"] = [{"offset": len(a["prompt"]) - a_len, "length": a_len, "hash": "image0"}]
    b_head = draw(st.integers(1, 6))
    budget = len(a["prompt"]) + b_head  # step 0: a whole, b up to its image
    if _one_in(draw, 4):
        b_head = draw(st.integers(0, 12))
    b = {"prompt": _text(draw, b_head) + [0] * b_len + _text(draw, draw(st.integers(0, 3))),
         "output": _text(draw, draw(st.integers(1, 3))),
         "mm_inputs": [{"offset": b_head, "length": b_len, "hash": "image1"}]}
    requests = [a, b]
    longest = max(len(q["prompt"]) + len(q["output"]) for q in requests)
    config = draw(configs(block_size=st.sampled_from([2, 4, 8]), max_model_len=longest + 8,
                          enable_chunked_prefill=True, max_num_batched_tokens=budget,
                          long_prefill_token_threshold=0, max_num_seqs=st.integers(2, 4),
                          spare_blocks=st.integers(2, 8), policy="fcfs",
                          num_speculative_tokens=0))
    config["encoder_cache_size"] = cache
    config["encoder_compute_budget"] = max(cache, budget)
    for rid, q in zip(draw(request_ids(len(requests))), requests):
        q["id"] = rid
    data = {"config": config, "requests": requests}
    if _one_in(draw, 3):
        if config.get("kv_cache_memory_bytes") is not None:  # sized as one worker: in pages
            config["num_gpu_blocks"] = kv_cache_layout(parse_drawn_stream(data).config).num_blocks
            del config["kv_cache_memory_bytes"]
        config["pipeline_parallel_size"] = draw(st.integers(2, 3))
    else:
        config["async_scheduling"] = True
    _draw_ready_steps(draw, config, 12, [0.0, 0.0, 0.5, 1.0])
    return data


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


@st.composite
def lora_encoder_skip_streams(draw, **knobs: Any) -> dict[str, Any]:
    """LoRA adapters meeting a spent encoder budget: a first request without an adapter
    holds two images, each using up the encoder's budget in its step; behind it, one or
    two requests under adapters hold an image right after a short text prefix, and one or
    two more arrive under other adapters at step 0 or 1.  In step 1 the adapters'
    requests are running but get no token (their image cannot be encoded yet), so their
    adapters do not hold slots, and a waiting request under another adapter is admitted;
    when they run again the step holds more adapters than ``max_loras`` and vLLM fails
    its assertion (quirks.LORA_SLOTS_OVERFILLED_AFTER_A_SKIP).  Now and then the first
    request runs under the first adapter, or the encoder's budget has a token to spare,
    and nothing fails.  ``knobs`` are not used (the requests are built here).
    Shrinks towards: one adapter slot, 2-token images, one request of each kind.
    """
    length = draw(st.integers(2, 6))
    max_loras = draw(st.integers(1, 2))
    block_size = draw(st.sampled_from([4, 2, 8]))
    config = draw(configs(block_size=block_size, max_model_len=48, budget=64,
                          max_num_seqs=st.integers(4, 6), spare_blocks=st.integers(4, 16),
                          enable_chunked_prefill=True, num_speculative_tokens=0,
                          long_prefill_token_threshold=0, policy="fcfs"))
    config["max_loras"] = max_loras
    config["encoder_compute_budget"] = length + (1 if _one_in(draw, 6) else 0)
    config["encoder_cache_size"] = 3 * length
    gap, tail = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    first = [0] * length + _tokens(draw, gap, DEFAULT_VOCAB_SIZE, frozenset({0})) \
        + [0] * length + _tokens(draw, tail, DEFAULT_VOCAB_SIZE, frozenset({0}))
    stalled = draw(st.integers(1, max_loras))
    late = draw(st.integers(1, 2))
    ids = draw(request_ids(1 + stalled + late))
    head = {"id": ids[0], "prompt": first, "output": _tokens(draw, draw(st.integers(2, 4)),
                                                                  DEFAULT_VOCAB_SIZE),
            "mm_inputs": [{"offset": 0, "length": length, "hash": "image0"},
                          {"offset": length + gap, "length": length, "hash": "image1"}]}
    if _one_in(draw, 8):
        head["lora"] = "adapter0"
    requests = [head]
    for n, rid in enumerate(ids[1:1 + stalled]):
        prefix = _tokens(draw, draw(st.integers(1, 4)), DEFAULT_VOCAB_SIZE, frozenset({0}))
        rest = _tokens(draw, draw(st.integers(1, 4)), DEFAULT_VOCAB_SIZE, frozenset({0}))
        requests.append({"id": rid, "prompt": prefix + [0] * length + rest,
                         "output": _tokens(draw, draw(st.integers(3, 6)), DEFAULT_VOCAB_SIZE),
                         "lora": f"adapter{n}",
                         "mm_inputs": [{"offset": len(prefix), "length": length,
                                        "hash": f"image{2 + n}"}]})
    arrival = 0
    for n, rid in enumerate(ids[1 + stalled:]):
        arrival = draw(st.integers(arrival, 1))
        requests.append({"id": rid,
                         "prompt": _tokens(draw, draw(st.integers(1, 6)), DEFAULT_VOCAB_SIZE),
                         "output": _tokens(draw, draw(st.integers(2, 6)), DEFAULT_VOCAB_SIZE),
                         "lora": f"adapter{stalled + n}", "arrival_step": arrival})
    return {"config": config, "requests": requests}


#: The request fields a pooling request keeps (it has no sampling parameters).
POOLING_KEEPS = ("id", "prompt", "arrival_step", "priority", "abort_step", "cache_salt", "lora",
                 "mm_inputs")


@st.composite
def pooling_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Pooling requests (embeddings): every request pools, so none samples a token and
    each finishes once its prefill is computed -- after several chunks under the small
    token budgets, after preemption in tight pools, or at once on a prefix hit from a
    shared prompt.  Streams of :func:`streams` (no drafts) with the sampling fields
    dropped and the outputs emptied.  ``knobs`` go to :func:`streams`.
    Shrinks towards: the shrunk :func:`streams` stream, pooled.
    """
    config = configs(num_speculative_tokens=0, budget=st.integers(2, 24),
                     spare_blocks=st.integers(0, 6))
    data = draw(streams(**_with(dict(config=config, min_requests=1, max_requests=6,
                                     shared_prefixes="always", prompt_logprobs=False,
                                     drafts=False), knobs)))
    data["requests"] = [{**{k: r[k] for k in POOLING_KEEPS if k in r}, "output": [],
                         "pooling": True} for r in data["requests"]]
    return data


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


def _likely_steps(requests: list[dict], config: dict) -> int:
    """About how many steps a batch-queue stream takes (at most 80)."""
    return min(80, max((r.get("arrival_step", 0) for r in requests), default=0)
               + sum(len(r["prompt"]) for r in requests) // config["max_num_batched_tokens"]
               + sum(len(r["output"]) for r in requests) + 4)


def _draw_ready_steps(draw, config: dict, horizon: int, shares: list[float]) -> None:
    """The steps whose batch the worker is done with at once: a drawn share of them."""
    share = draw(st.sampled_from(shares))
    rng = draw(st.randoms(use_true_random=False))
    ready = [step for step in range(horizon) if rng.random() < share]
    if ready:
        config["async_ready_steps"] = ready


def _without_drafts_and_transfers(requests: list[dict]) -> None:
    """A batch queue takes no drafts (vLLM refuses them) and no scripted KV transfers."""
    for req in requests:
        req.pop("drafts", None)
        req.pop("kv_transfer", None)


def _align_model_len(data: dict[str, Any]) -> None:
    """Lower ``max_model_len`` to one more than a multiple of the page size (above every
    prompt), so that a request stopped by it has its last page filled by a token the
    scheduler only knew as a placeholder: that page is cached when the batch is applied,
    or never (no later step allocates for the request)."""
    config = data["config"]
    longest = max(len(r["prompt"]) for r in data["requests"])
    aligned = config["max_model_len"] - (config["max_model_len"] - 1) % config["block_size"]
    if aligned <= longest or aligned == config["max_model_len"]:
        return
    candidate = {**data, "config": {**config, "max_model_len": aligned}}
    try:
        parse_drawn_stream(candidate)
    except StreamError:
        return
    data["config"] = candidate["config"]


def _add_follow_up(draw, data: dict[str, Any], arrival: int) -> None:
    """A request arriving once the others are likely done whose prompt is an earlier
    request's prompt and whole output: its hit reaches the pages that the earlier
    request's last tokens filled (under async scheduling cached when they were applied),
    and the steps before it report finished requests with nothing to run (empty
    batches).  Left out where the stream rules refuse it."""
    generating = [r for r in data["requests"] if r["output"]]
    if not generating:
        return
    earlier = draw(st.sampled_from(generating))
    prompt = (earlier["prompt"] + earlier["output"])[:data["config"]["max_model_len"] - 1]
    taken = {r["id"] for r in data["requests"]}
    follow_up = {**{k: v for k, v in earlier.items() if k not in ("id", "abort_step")},
                 "id": next(f"r{n}" for n in range(999, 0, -1) if f"r{n}" not in taken),
                 "prompt": prompt, "arrival_step": arrival}
    candidate = {**data, "requests": data["requests"] + [follow_up]}
    try:
        parse_drawn_stream(candidate)
    except StreamError:
        return
    data["requests"] = candidate["requests"]


def any_stream(**knobs: Any) -> SearchStrategy[dict[str, Any]]:
    """Any stream: the general :func:`streams` or one of the focused or targeted variants.

    ``knobs`` go to every branch.  Shrinks towards the general
    :func:`streams` branch (the first one).
    """
    return st.one_of(streams(**knobs), preemption_streams(**knobs),
                     prefix_cache_streams(**knobs), chunked_prefill_streams(**knobs),
                     spec_decode_streams(**knobs), stop_and_abort_streams(**knobs),
                     crowd_streams(**knobs), set_aside_streams(**knobs),
                     priority_victim_streams(**knobs), hybrid_streams(**knobs),
                     window_hit_streams(**knobs), draft_window_streams(**knobs),
                     lora_streams(**knobs), grammar_streams(**knobs), mm_streams(**knobs),
                     encoder_pressure_streams(**knobs), mm_hash_streams(**knobs),
                     lora_encoder_skip_streams(**knobs), pooling_streams(**knobs),
                     async_streams(**knobs))
