"""The design differences of simulators (harness.checks.designs): each one explains a stream
that nothing else in the catalogue explains.

For every design, ``fixtures/designs/<name>.json`` is a small stream on which

* the reference with the design gives another trace than the reference (every field
  compared), and
* no other single catalogue entry -- every candidate the profile tries on the stream
  (harness.jobs.engine_profile.candidates: the mutants, then the other designs) -- gives
  the trace the design gives: the design alone explains it.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import pytest

from harness.checks.designs import DESIGNS, USED_BY
from harness.checks.mutants import REFERENCE_MUTANTS, VLLM_PREFIX
from harness.engines import get_engine
from harness.formats.paths import ROOT
from harness.formats.stream import parse_stream
from harness.jobs.engine_profile import candidates
from harness.loop.runner import run

FIXTURES = ROOT / "fixtures" / "designs"


def trace(stream, entries=()) -> dict:
    """The reference's trace of ``stream`` (vLLM 0.11.0's rules) with ``entries`` applied."""
    with ExitStack() as stack:
        for entry in entries:
            stack.enter_context(entry.patch())
        return run(get_engine("reference", "0.11.0"), stream).to_json()


@pytest.mark.parametrize("design", DESIGNS, ids=lambda d: d.name)
def test_each_design_alone_explains_its_stream(design):
    stream = parse_stream(json.loads((FIXTURES / f"{design.name}.json").read_text()))
    given = trace(stream, [design])
    assert given != trace(stream, []), f"{design.name} changes nothing on its stream"
    also = [m.name for m in candidates(stream)
            if m is not design and trace(stream, [m]) == given]
    assert also == [], f"{design.name}'s stream is explained by {also} too"


def test_one_stream_per_design_and_nothing_else():
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(d.name for d in DESIGNS)


def test_catalogue_names_are_unique_and_no_mutants():
    names = [d.name for d in DESIGNS]
    assert len(set(names)) == len(names)
    assert not set(names) & {m.name for m in REFERENCE_MUTANTS}
    assert not [n for n in names if n.startswith(VLLM_PREFIX)]  # vLLM's mutants' names
    assert set(USED_BY) == set(names)
    assert all(d.side == "design" and d.rule and d.mirrors.startswith("vllm/") for d in DESIGNS)
