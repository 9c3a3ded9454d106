"""Mutants: one-rule deviations that the conformance run must catch.

The catalogue is the reference's mutants (:mod:`harness.mutants.rules`, each
registered next to the function that replaces its rule) and vLLM's
(:mod:`harness.engines.vllm_mutants`, patches of the real package that stand
in for an upgrade).  :mod:`harness.mutants.hunt` runs the properties against
each.
"""

from __future__ import annotations

from harness.mutants.rules import MUTANTS as REFERENCE_MUTANTS
from harness.patches import Mutant


def catalogue(include_vllm: bool = True) -> list[Mutant]:
    """Every mutant; vLLM's only when asked (they import vLLM)."""
    if not include_vllm:
        return list(REFERENCE_MUTANTS)
    from harness.engines.vllm_mutants import MUTANTS as VLLM_MUTANTS
    return REFERENCE_MUTANTS + VLLM_MUTANTS


def find(name: str) -> Mutant | None:
    """The mutant called ``name``; vLLM's are looked at only when no reference one matches."""
    for m in REFERENCE_MUTANTS:
        if m.name == name:
            return m
    return next((m for m in catalogue() if m.name == name), None)
