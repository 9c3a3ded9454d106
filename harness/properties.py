"""The conformance properties: one registry, read by the tests, the mutant hunt
and the strategy quality tests.

Each property is a strategy of streams on which the reference must give vLLM's
trace exactly.  ``tests/test_conformance.py`` turns each into a test named
``test_conformance_<name>``; ``harness.mutants`` hunts with them in this order;
``tests/test_strategies.py`` checks that each strategy reaches the rules it
lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hypothesis.strategies import SearchStrategy

from harness import strategies as st


@dataclass(frozen=True)
class Property:
    name: str
    strategy: Callable[[], SearchStrategy]
    # Rules (as named by the strategy quality tests) its streams are meant to reach.
    rules: tuple[str, ...] = ()

    @property
    def test_name(self) -> str:
        return f"test_conformance_{self.name}"


PROPERTIES: tuple[Property, ...] = (
    Property("whole_space", st.any_stream),
    Property("preemption", st.preemption_streams,
             ("preempt_fcfs", "preempt_priority", "prefix_hit_after_preemption")),
    Property("prefix_caching", st.prefix_cache_streams, ("evict",)),
    Property("chunked_prefill", st.chunked_prefill_streams, ("chunked_prefill",)),
    Property("spec_decode", st.spec_decode_streams, ("draft_rejection",)),
    Property("stops_and_aborts", st.stop_and_abort_streams,
             ("abort_waiting", "abort_running", "abort_preempted", "eos_stop",
              "stop_token_stop", "max_model_len_stop")),
)


def by_name(name: str) -> Property:
    return next(p for p in PROPERTIES if p.name == name)
