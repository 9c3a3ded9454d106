"""The live requests' states a step record holds, read by an engine's own ``step_states``
or one ``state`` call each: the same record either way."""

from __future__ import annotations

from harness.engines.reference_engine import ReferenceEngine
from harness.formats.steps import RequestState
from harness.formats.stream import parse_stream
from harness.loop.runner import run, states_reader
from tests.stream_builders import req, stream


def small_stream():
    return parse_stream(stream({"max_num_batched_tokens": 16, "max_num_seqs": 2},
                               [req("a", prompt=[1] * 20, output=[4, 5, 6]),
                                req("b", prompt=[2] * 6, output=[7], arrival_step=1),
                                req("c", prompt=[3] * 9, output=[8, 9], arrival_step=2)]))


class OneByOne(ReferenceEngine):
    """The reference read through ``state`` alone (its own, unchanged)."""

    def state(self, req_id: str) -> RequestState:
        return super().state(req_id)


class Renamed(ReferenceEngine):
    """A subclass that changes ``state`` alone."""

    def state(self, req_id: str) -> RequestState:
        s = super().state(req_id)
        return RequestState(s.status.lower(), s.num_computed_tokens, s.num_output_tokens)


def test_own_step_states_give_the_records_state_gives():
    s = small_stream()
    assert run(ReferenceEngine(), s).dumps() == run(OneByOne(), s).dumps()


def test_a_subclass_that_changes_state_is_read_through_it():
    s = small_stream()
    assert states_reader(Renamed(), False).__code__.co_names != states_reader(
        ReferenceEngine(), False).__code__.co_names
    statuses = {st for step in run(Renamed(), s).steps for st in step["status"].values()}
    assert statuses and all(st == st.lower() for st in statuses)
