"""The harness can fail: a fast subset of the mutant catalogue must be killed.

``make mutants`` (``python -m harness mutants``) runs the whole catalogue.
"""

from __future__ import annotations

import pytest

from harness.checks import mutants
from harness.jobs.mutant_hunt import hunt
from harness.formats.mutant import Mutant

pytestmark = [pytest.mark.selftest, pytest.mark.needs_vllm]

FAST_SUBSET = ["free_forward_order", "evict_from_tail", "no_null_block", "hash_kept_on_reuse",
               "tokens_after_stop_kept", "vllm_stop_tokens_ignored", "vllm_free_forward_order"]


@pytest.fixture(autouse=True)
def _counterexamples_elsewhere(tmp_path, monkeypatch):
    """These tests provoke divergences on purpose: their counterexamples go to a temporary folder."""
    monkeypatch.setenv("HARNESS_COUNTEREXAMPLES", str(tmp_path / "counterexamples"))


def test_catalogue_names_are_unique_and_documented():
    names = [m.name for m in mutants.catalogue(include_vllm=False)]
    assert len(names) == len(set(names)) >= 20
    for m in mutants.catalogue(include_vllm=False):
        assert m.rule and m.mirrors.startswith("vllm/")


def test_vllm_mutants_are_known_by_name_without_vllm():
    """``find`` imports vLLM only for a vLLM mutant's name: an unknown name is unknown
    (exit 2) in an install without vLLM, not an import error."""
    vllm_names = [m.name for m in mutants.catalogue()[len(mutants.REFERENCE_MUTANTS):]]
    assert vllm_names and all(n.startswith(mutants.VLLM_PREFIX) for n in vllm_names)
    assert not any(m.name.startswith(mutants.VLLM_PREFIX) for m in mutants.REFERENCE_MUTANTS)
    import subprocess
    import sys
    code = ("import sys; from harness.checks.mutants import find; "
            "assert find('no_such_rule') is None; "
            "print('harness.engines.vllm_mutants' in sys.modules, 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize("name", FAST_SUBSET)
def test_mutant_is_killed(name, vllm_engine):
    result = hunt(mutants.find(name), max_examples=100, shrink=False)
    assert result.killed, f"mutant {name} survived {result.examples} streams"


def test_unpatched_reference_is_not_a_mutant(vllm_engine):
    """The hunt itself finds nothing when no rule is broken (a null mutant)."""
    import contextlib
    null = Mutant("null", "nothing broken", "vllm/v1/core/sched/scheduler.py",
                  contextlib.nullcontext)
    assert not hunt(null, max_examples=15).killed


#: What a mutant's replacement raises when it no longer fits what it replaces (a
#: signature or return shape the reference has since changed), rather than a rule that
#: no longer holds.
_STALE = ("TypeError", "AttributeError", "NameError")


def test_no_mutant_kills_by_crashing_the_reference():
    """A mutant killed because its patch no longer fits the reference proves nothing.

    Found on 2026-12-02: no_null_block, outputs_in_id_order and tokens_after_stop_kept
    had fallen behind changes to BlockPool.__init__, update_from_output and
    _append_outputs; they raised TypeError on (nearly) every stream, so every
    stream "killed" them.  On each bundled stream that the reference runs cleanly,
    no mutant may make it raise one of these.
    """
    from harness.engines import get_engine
    from harness.formats.paths import STREAMS_DIR
    from harness.loop.runner import run
    from harness.formats.stream import load_stream
    streams = [load_stream(p) for p in sorted(STREAMS_DIR.glob("*.json"))]
    stale = []
    for m in mutants.REFERENCE_MUTANTS:
        if m.patch is None or m.checked_by != "streams":
            continue
        engine = get_engine("reference", release=m.release or "0.11.0")
        for stream in streams:
            if m.applies is not None and not m.applies(stream):
                continue
            if run(engine, stream).verdict == "engine_failure":
                continue
            with m.patch():
                trace = run(engine, stream)
            if trace.verdict == "engine_failure" and trace.failure["message"].startswith(_STALE):
                if m.release and run(get_engine("reference", "0.11.0"), stream).failure == \
                        trace.failure:
                    continue  # a later release's fix taken out: 0.11.0's own crash is back
                stale.append(f"{m.name} on {stream.name}: {trace.failure['message']}")
                break
    assert not stale, "\n".join(stale)
