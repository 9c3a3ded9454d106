"""The whole space: :func:`any_stream` mixes the general strategy and every focused
and targeted one."""

from __future__ import annotations

from typing import Any

from hypothesis.strategies import SearchStrategy

from harness.checks.strategies.draws import st
from harness.checks.strategies.engine_loop import async_streams
from harness.checks.strategies.inputs import (
    encoder_pressure_streams,
    grammar_streams,
    lora_encoder_skip_streams,
    lora_streams,
    mm_hash_streams,
    mm_streams,
    pooling_streams,
)
from harness.checks.strategies.kv_groups import (
    draft_window_streams,
    hybrid_streams,
    window_hit_streams,
)
from harness.checks.strategies.scheduling import (
    chunked_prefill_streams,
    crowd_streams,
    preemption_streams,
    prefix_cache_streams,
    priority_victim_streams,
    set_aside_streams,
    spec_decode_streams,
    stop_and_abort_streams,
)
from harness.checks.strategies.streams import streams


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
