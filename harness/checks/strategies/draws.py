"""What every strategy draws with: hypothesis's strategies built once per argument list,
composites whose draws skip hypothesis's repeated bookkeeping, small helpers for rare
choices, and the token, prompt, output and draft draws of a request."""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

import hypothesis
from hypothesis import strategies as _hypothesis_strategies
from hypothesis.strategies import SearchStrategy

from harness.checks.profiles import pin_local_constants
from harness.formats.scripted_model import accepted_prefix
from harness.formats.stream import Config, StreamError, parse_drawn_stream

# Wherever the strategies draw (the harness's profiles, the benchmark, a user's own
# @given), a seed draws the same streams whatever other code the process has loaded.
pin_local_constants()

try:
    from hypothesis.errors import FlakyStrategyDefinition
    from hypothesis.internal.compat import add_note
    from hypothesis.internal.conjecture.choice import ValueHole
    from hypothesis.internal.conjecture.data import MAX_DEPTH
    from hypothesis.internal.conjecture.utils import (calc_label_from_callable,
                                                     calc_label_from_cls, combine_labels)
    from hypothesis.strategies._internal.core import CompositeStrategy
    from hypothesis.strategies._internal.lazy import unwrap_strategies
    from hypothesis.strategies._internal.utils import defines_strategy
except ImportError:  # pragma: no cover - another hypothesis: its own composite
    _FOLLOWED = False
else:
    _FOLLOWED = hypothesis.__version__ in frozenset({"6.170.17"})

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
        kinds = tuple(map(type, value))
        if _ATOMS.issuperset(kinds):  # plain values only (a sampled_from list): one step
            return kind, tuple(value), kinds
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


def _call_key(args: tuple, kwargs: dict[str, Any]) -> Any:
    """The memo key of a constructor's arguments (see :func:`_memo_key`)."""
    if kwargs:
        return _memo_key((args, tuple(sorted(kwargs.items()))))
    for a in args:
        if type(a) is not int:
            return _memo_key(args)
    return args  # integers(a, b): the common case, keyed cheaply


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
        key = _call_key(args, kwargs)
        if key is None:
            return make(*args, **kwargs)
        strategy = made.get(key)
        if strategy is None:
            if len(made) >= _MEMO_SIZE:
                made.clear()
            strategy = made[key] = make(*args, **kwargs)
        return strategy
    return cached


# -- composites with a cheaper draw ------------------------------------------------------------
#
# A stream makes about 150 draws, each a choice or two wrapped in a span.  Hypothesis's
# ``ConjectureData.draw`` works out again on every draw what never changes for a strategy
# (that it is valid and not empty, what it unwraps to, its label) and runs three imports:
# about a third of a draw.  The ``draw`` that :func:`composite` hands its definition does
# what ``ConjectureData.draw`` does for a draw nested in another one -- a span with the
# strategy's label around its ``do_draw``, the value recorded for the span -- with those
# answers worked out once per strategy; anything out of the ordinary (a label given, a
# value to re-encode while shrinking, the depth limit, an empty strategy) goes to
# hypothesis's own ``data.draw``.  The choices, spans, labels and recorded values are
# hypothesis's own, so a seed draws the same streams and shrinks them the same way
# (tests/test_strategies.py compares the two draws).  It follows ``ConjectureData.draw``
# of the hypothesis releases in ``_FOLLOWED``; under another, ``composite`` is
# hypothesis's own.

#: Whether composites draw with :func:`_cheap_draw` (tests switch it off to compare).
cheap_draws = _FOLLOWED

#: Where a strategy keeps what :func:`_drawable` worked out for it.
_DRAWABLE = "_harness_drawable"


def composite(f: Callable[..., Any]) -> Callable[..., SearchStrategy]:
    """``st.composite(f)``, with :class:`_Composite` inside the lazy strategy hypothesis
    wraps a composite in (so the checks of ``f`` and the repr are hypothesis's)."""
    checked = _hypothesis_strategies.composite(f)
    if not _FOLLOWED:
        return checked

    @defines_strategy()
    @functools.wraps(checked)
    def build(*args: Any, **kwargs: Any) -> SearchStrategy:
        return _Composite(f, args, kwargs)
    return build


if _FOLLOWED:
    class _Composite(CompositeStrategy):
        """Hypothesis's composite strategy, whose definition draws with :func:`_cheap_draw`;
        its label is the one hypothesis gives the same definition."""

        def do_draw(self, data):
            draw = _cheap_draw(data) if cheap_draws and data.depth > 0 else data.draw
            return self.definition(draw, *self.args, **self.kwargs)

        def calc_label(self) -> int:
            return _composite_label(self.definition)

    _COMPOSITE_CLASS_LABEL = calc_label_from_cls(CompositeStrategy)


@functools.lru_cache(maxsize=None)
def _composite_label(definition: Callable) -> int:
    """The label hypothesis gives a composite of ``definition``, worked out once per
    definition (it hashes the definition's code) rather than once per strategy."""
    return combine_labels(_COMPOSITE_CLASS_LABEL, calc_label_from_callable(definition))


def _cheap_draw(data) -> Callable[..., Any]:
    """``data.draw`` for the draws of one composite (see above)."""
    record = data._ConjectureData__span_record  # where ConjectureData.draw records values
    slow = data.draw

    def draw(strategy: SearchStrategy, label: int | None = None) -> Any:
        drawable = _drawable(strategy)
        if (label is not None or drawable is None or data.depth >= MAX_DEPTH
                or _at_value_hole(data)):
            return slow(strategy, label)
        do_draw, span_label = drawable
        span = record.span_count
        data.start_span(span_label)
        try:
            value = do_draw(data)
        except FlakyStrategyDefinition as err:
            add_note(err, f"while drawing from {strategy!r}")
            raise
        else:
            record.record_value_for_span(span, value)
            return value
        finally:
            data.stop_span()
    return draw


def _drawable(strategy: SearchStrategy) -> tuple[Callable, int] | None:
    """What a draw from ``strategy`` runs, and its span's label; None for an empty
    strategy.  Validated (raising as hypothesis's draw raises) and worked out once."""
    known = strategy.__dict__.get(_DRAWABLE)
    if known is None:
        strategy.validate()
        if strategy.is_empty:
            return None
        unwrapped = unwrap_strategies(strategy)
        known = strategy.__dict__[_DRAWABLE] = (unwrapped.do_draw, unwrapped.label)
    return known


def _at_value_hole(data) -> bool:
    """Whether the shrinker left a value here for the draw to re-encode (which
    hypothesis's own draw does)."""
    prefix = data.prefix
    return prefix is not None and data.index < len(prefix) and isinstance(
        prefix[data.index], ValueHole)


#: ``hypothesis.strategies`` with the constructors this module calls inside its draws
#: memoized (:func:`_memoized`) and :func:`composite` with its cheaper draw; everything
#: else is hypothesis's own.
st = types.SimpleNamespace(**{name: getattr(_hypothesis_strategies, name)
                              for name in _hypothesis_strategies.__all__})


for _name in ("binary", "booleans", "integers", "just", "lists", "none", "one_of",
              "sampled_from"):
    setattr(st, _name, _memoized(getattr(_hypothesis_strategies, _name)))
st.composite = composite


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


def _tokens(draw, n: int, vocab: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """``n`` tokens from the alphabet minus ``avoid``.

    Drawn as ``n`` bytes in one draw (a token per draw makes generation several
    times slower); shrinks like bytes do, towards the smallest allowed token.
    """
    if n <= 0:
        return []
    allowed = _alphabet(vocab, avoid)
    raw = draw(_bytes_of_length(n))
    return [allowed[b % len(allowed)] for b in raw]


@functools.lru_cache(maxsize=1024)
def _alphabet(vocab: int, avoid: frozenset[int]) -> tuple[int, ...]:
    """The tokens ``0 .. vocab - 1`` but those in ``avoid``."""
    return tuple(t for t in range(vocab) if t not in avoid)


@_memoized
def _bytes_of_length(n: int) -> SearchStrategy[bytes]:
    """``st.binary(min_size=n, max_size=n)``, looked up by ``n`` alone."""
    return _hypothesis_strategies.binary(min_size=n, max_size=n)


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


def _with(defaults: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    return {**defaults, **knobs}


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
