"""Conformance properties: generated streams must give vLLM's trace exactly.

One property per area of the scheduler and one over the whole space.  Each
runs a stream through the installed vLLM and through the reference and
compares every step (harness.diff).  A failure prints the first divergent
step side by side and leaves the shrunk stream in counterexamples/<test>.json
with the command that replays it.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given

from harness import strategies as st
from harness.conformance import KnownDivergent, assert_conforms
from harness.golden import STREAMS_DIR

pytestmark = [pytest.mark.conformance, pytest.mark.needs_vllm]


def known_divergences_xfail(test):
    """A divergence named in harness.known is an expected failure, with its reason."""
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        try:
            test(*args, **kwargs)
        except KnownDivergent as exc:
            pytest.xfail(str(exc))
        except BaseExceptionGroup as group:
            if all(isinstance(e, KnownDivergent) for e in group.exceptions):
                pytest.xfail(str(group.exceptions[0]))
            raise
    return wrapper


@pytest.fixture(scope="module", autouse=True)
def _engines(vllm_engine):
    """Import vLLM once per process (the session fixture skips with a reason)."""
    return vllm_engine


@known_divergences_xfail
@given(st.preemption_streams())
def test_conformance_preemption(data):
    assert_conforms(data, label="test_conformance_preemption")


@known_divergences_xfail
@given(st.prefix_cache_streams())
def test_conformance_prefix_caching(data):
    assert_conforms(data, label="test_conformance_prefix_caching")


@known_divergences_xfail
@given(st.chunked_prefill_streams())
def test_conformance_chunked_prefill(data):
    assert_conforms(data, label="test_conformance_chunked_prefill")


@known_divergences_xfail
@given(st.spec_decode_streams())
def test_conformance_spec_decode(data):
    assert_conforms(data, label="test_conformance_spec_decode")


@known_divergences_xfail
@given(st.stop_and_abort_streams())
def test_conformance_stops_and_aborts(data):
    assert_conforms(data, label="test_conformance_stops_and_aborts")


@known_divergences_xfail
@given(st.any_stream())
def test_conformance_whole_space(data):
    assert_conforms(data, label="test_conformance_whole_space")


@pytest.mark.parametrize("path", sorted(STREAMS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_conformance_bundled_stream(path):
    """python -m harness check is exit 0 on every stream in fixtures/streams/."""
    import json
    assert_conforms(json.loads(path.read_text()), label=f"bundled-{path.stem}")
