"""Streams for models with several KV cache groups: hybrid full and sliding-window
attention, prefix hits after windows have slid, and drafts that decide their pages."""

from __future__ import annotations

from typing import Any

from hypothesis.strategies import SearchStrategy

from harness.checks.strategies.configs import _group, configs
from harness.checks.strategies.draws import _one_in, _rarely, _with, st
from harness.checks.strategies.streams import _spec_of, streams


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
