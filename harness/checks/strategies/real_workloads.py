"""Real traffic as a conformance property (``real_workloads``): windows of the bundled
samples of public serving traces, under the configs a server would run."""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any

from hypothesis import strategies as st

from harness.checks.strategies.configs import configs
from harness.checks.strategies.draws import _draw_ready_steps, _likely_steps, _one_in, _rarely
from harness.formats.paths import WORKLOADS_DIR
from harness.formats.public_traces import (
    drafts_of,
    pages_of,
    read_trace,
    round_half_up,
    scale_window,
)

#: The bundled samples of public serving traces (fixtures/workloads/README.md) and
#: their formats.
BUNDLED_WORKLOADS = {"mooncake_conversation.jsonl": "mooncake",
                     "mooncake_synthetic.jsonl": "mooncake",
                     "azure_code.csv": "azure", "azure_conv.csv": "azure"}


#: The requests of a sample that windows are drawn from: all of them (each sample holds a
#: few hundred), read once.
MAX_WORKLOAD_REQUESTS = 10_000


@functools.lru_cache(maxsize=None)
def bundled_workload(name: str) -> tuple:
    """The requests of one bundled trace sample, read once per process."""
    return tuple(read_trace(WORKLOADS_DIR / name, BUNDLED_WORKLOADS[name],
                            wanted=range(MAX_WORKLOAD_REQUESTS))[1])


@st.composite
def real_workload_streams(draw, **knobs: Any) -> dict[str, Any]:
    """Real traffic: a window of 2-10 consecutive requests of a bundled public trace
    (Mooncake's conversation and synthetic traces, whose hash ids give each trace block
    one page of tokens shared exactly where the trace shares it; Azure's code and
    conversation traces), in the trace's order, their arrival spacing compressed so that
    the window spans 0 (a burst) to 64 steps, lengths scaled to one page per 512-token
    trace block and clipped to a model length of at most 32 pages.  Over those arrivals
    the config varies what a server would: pool pressure, both policies (priorities
    drawn, the traces have none), chunked prefill, prefix caching, ngram drafts accepted
    whole or in part, hybrid KV cache groups, and async scheduling one time in four.
    ``knobs`` are not used (the requests come from the trace).
    Shrinks towards: the first sample's first two requests, pages of 4, a burst.
    """
    name = draw(st.sampled_from(sorted(BUNDLED_WORKLOADS, key=lambda n: not n.startswith("moon"))))
    records = bundled_workload(name)
    size = draw(st.integers(2, 10))
    start = draw(st.integers(0, len(records) - size))
    window = records[start:start + size]
    block_size = draw(st.sampled_from([4, 2, 8]))
    scale = Fraction(block_size, 512)
    longest = max(max(1, round_half_up(r.prompt_tokens * scale))
                  + max(1, round_half_up(r.output_tokens * scale)) for r in window)
    max_model_len = min(32, pages_of(longest, block_size)) * block_size
    span = window[-1].arrival_ms - window[0].arrival_ms
    steps = draw(st.sampled_from([0, 8, 32, 64]))
    ms_per_step = max(Fraction(1), span / steps) if steps else Fraction(10) ** 13
    scaled = scale_window(window, block_size, scale, ms_per_step, max_model_len)
    asynchronous = _one_in(draw, 4)
    config = draw(configs(
        block_size=block_size, max_model_len=max_model_len,
        max_num_seqs=st.integers(2, 8), budget=st.sampled_from([16, 32, 64, 128]),
        spare_blocks=st.one_of(st.integers(1, 4), st.integers(5, 64)),
        hybrid=not asynchronous and _one_in(draw, 4),
        num_speculative_tokens=0 if asynchronous else draw(
            _rarely(st.integers(1, 3), st.just(0), one_in=3)),
        speculative_method="ngram"))
    requests = []
    for s in scaled:
        requests.append({"id": f"r{s.record.index}", "prompt": list(s.prompt),
                         "output": list(s.output), "arrival_step": s.arrival_step})
    if config["policy"] == "priority":
        for r in requests:
            r["priority"] = draw(st.integers(0, 2))
    spec = config["num_speculative_tokens"]
    if spec:
        acceptance = draw(st.sampled_from([Fraction(1), Fraction(3, 4), Fraction(1, 2)]))
        rng = draw(st.randoms(use_true_random=False))
        for r in requests:
            r["drafts"] = [list(d) for d in drafts_of(tuple(r["output"]), spec, acceptance, rng)]
    data = {"config": config, "requests": requests}
    if asynchronous:
        config.update(async_scheduling=True)
        _draw_ready_steps(draw, config, _likely_steps(requests, config), [0.0, 0.5, 1.0])
    config["max_steps"] = max(config["max_steps"], 4 * _likely_steps(requests, config)
                              + requests[-1]["arrival_step"] + 64)
    return data
