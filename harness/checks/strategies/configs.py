"""Engine configs (:func:`configs`) and KV cache groups (:func:`kv_cache_groups`), drawn
valid: the stream format's config rules are built into the draws."""

from __future__ import annotations

from typing import Any

from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from harness.checks.strategies.draws import (
    _CONFIG_FIELDS,
    _MEMO_SIZE,
    DEFAULT_MAX_STEPS,
    DEFAULT_MODEL,
    _cdiv,
    _memo_key,
    _memoized,
    _one_in,
    _rarely,
    _value,
    st,
)
from harness.formats.stream import (
    Config,
    KVCacheGroup,
    StreamError,
    max_pages_per_request,
    model_shape,
    parse_drawn_stream,
    shape_errors,
)


@_memoized
@st.composite
def configs(draw, **overrides: Any) -> dict[str, Any]:
    """A valid engine config dict (every field of :class:`harness.formats.stream.Config`).

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
        page = model_shape(config["model"]).page_size_bytes_all_layers(block_size)
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
    """The KV cache groups of a hybrid model, valid for the config (see ``harness.formats.stream``).

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
