"""The harness can fail: a fast subset of the mutant catalogue must be killed.

``make mutants`` (``python -m harness mutants``) runs the whole catalogue.
"""

from __future__ import annotations

import pytest

from harness import mutants
from harness.mutants.hunt import hunt
from harness.patches import Mutant

pytestmark = [pytest.mark.conformance, pytest.mark.needs_vllm]

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


@pytest.mark.parametrize("name", FAST_SUBSET)
def test_conformance_mutant_is_killed(name, vllm_engine):
    result = hunt(mutants.find(name), max_examples=100, shrink=False)
    assert result.killed, f"mutant {name} survived {result.examples} streams"


def test_unpatched_reference_is_not_a_mutant(vllm_engine):
    """The hunt itself finds nothing when no rule is broken (a null mutant)."""
    import contextlib
    null = Mutant("null", "nothing broken", "vllm/v1/core/sched/scheduler.py",
                  contextlib.nullcontext)
    assert not hunt(null, max_examples=15).killed
