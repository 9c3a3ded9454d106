"""Conformance properties: generated streams must give vLLM's trace exactly.

One property per area of the scheduler and one over the whole space, each a
test made from the registry in ``harness.checks.properties``.  Each
runs a stream through the installed vLLM and through the reference and
compares every step (harness.checks.diff).  A failure prints the first divergent
step side by side and leaves the shrunk stream in counterexamples/<test>.json
with the command that replays it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.checks import profiles
from harness.checks.conformance import assert_conforms
from harness.formats.paths import ROOT, STREAMS_DIR
from harness.formats import features
from harness.checks.properties import PROPERTIES, given_property
from harness.formats.stream import parse_drawn_stream, parse_stream

pytestmark = [pytest.mark.conformance, pytest.mark.needs_vllm]

NODE = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: HARNESS_TARGET=1: each stream's rule counters steer generation (harness.formats.rule_counters.aim_at).
AIM = profiles.aiming()


#: The engine held to the reference: vLLM, or the one `pytest --engine E` names.
UNDER_TEST: list = []


@pytest.fixture(scope="module", autouse=True)
def _engines(request):
    """Import vLLM once per process (the session fixture skips with a reason); with
    ``--engine E``, E is held to the reference instead, and vLLM is not needed."""
    from harness.checks import conformance
    from harness.checks.levels import LevelError, fields_of
    from harness.engines import UnknownEngine, get_engine
    name = request.config.getoption("--engine")
    try:
        UNDER_TEST[:] = [get_engine(name) if name else request.getfixturevalue("vllm_engine")]
        conformance.COMPARED = fields_of(request.config.getoption("--level"),
                                         request.config.getoption("--fields"))
    except (UnknownEngine, LevelError) as exc:
        pytest.exit(f"error: {exc}", returncode=2)
    yield UNDER_TEST[0]
    UNDER_TEST.clear()
    conformance.COMPARED = None


def _property_test(prop):
    def check(data):
        engine = UNDER_TEST[0]
        data = features.fit_for(data, engine)  # inside the features the engine declares
        stream = parse_drawn_stream(data)
        if engine.name != "vllm" and engine.refuses(stream) is not None:
            return  # not taken by this engine
        assert_conforms(stream, label=prop.test_name, aim=AIM, vllm=engine)

    test = given_property(prop, check)
    test.__name__ = test.__qualname__ = prop.test_name
    # The example database keys a test by its inner function, and every property's
    # `check` reads the same.  Keyed by the test's node id instead, as HypoFuzz keys it,
    # each property has its own entries and `--hypothesis-profile replay` finds what
    # `make dashboard` found.
    test.hypothesis.inner_test._hypothesis_internal_add_digest = f"{NODE}::{prop.test_name}".encode()
    test.__doc__ = f"Streams of strategies.{prop.strategy.__name__} conform."
    return test


for _prop in PROPERTIES:
    globals()[_prop.test_name] = _property_test(_prop)


@pytest.mark.parametrize("path", sorted(STREAMS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_conformance_bundled_stream(path):
    """python -m harness check is exit 0 on every stream in fixtures/streams/."""
    import json
    data = json.loads(path.read_text())
    engine = UNDER_TEST[0]
    data = features.fit_for(data, engine)  # inside the features it declares, as check --fit
    why = None if engine.name == "vllm" else engine.refuses(parse_stream(data))
    if why is not None:
        pytest.skip(f"{engine.name} does not take this stream: {why}")
    assert_conforms(data, label=f"bundled-{path.stem}", vllm=engine)
