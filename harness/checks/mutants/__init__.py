"""Mutants: one-rule deviations that the conformance run must catch.

The catalogue is the reference's mutants, each registered right above the function that
replaces its rule, in modules by the part of vLLM they break (:mod:`.kv_cache`,
:mod:`.scheduler`, :mod:`.kv_sizing`, :mod:`.equivalent`, :mod:`.inputs`,
:mod:`.reports`, :mod:`.engine_loop`, and :mod:`.releases` for the rule changes of later
releases), and vLLM's (:mod:`harness.engines.vllm_mutants`, patches of the real package
that stand in for an upgrade).  :mod:`harness.jobs.mutant_hunt` runs the properties
against each.
"""

from __future__ import annotations

from harness.formats.compiled import require_interpreted

require_interpreted("a mutant")  # before the modules below take the reference's functions

# Imported in this order, the modules register their mutants in the catalogue's order.
from harness.checks.mutants import kv_cache, scheduler, kv_sizing, equivalent  # noqa: F401,I001
from harness.checks.mutants import inputs, reports, engine_loop, releases  # noqa: F401,I001
from harness.checks.mutants.registry import MUTANTS as REFERENCE_MUTANTS
from harness.formats.mutant import Mutant


#: What every vLLM mutant's name starts with, so that a name is known to be one without
#: importing vLLM (tests/test_mutants.py holds them to it).
VLLM_PREFIX = "vllm_"


def catalogue(include_vllm: bool = True) -> list[Mutant]:
    """Every mutant; vLLM's only when asked (they import vLLM: without it, EngineUnavailable
    says so in one line)."""
    if not include_vllm:
        return list(REFERENCE_MUTANTS)
    from harness.engines import _vllm_importable
    with _vllm_importable():
        from harness.engines.vllm_mutants import MUTANTS as VLLM_MUTANTS
    return REFERENCE_MUTANTS + VLLM_MUTANTS


def find(name: str) -> Mutant | None:
    """The mutant called ``name``; vLLM's are looked at only when the name is one of
    theirs, so an unknown name needs no vLLM."""
    for m in REFERENCE_MUTANTS:
        if m.name == name:
            return m
    if not name.startswith(VLLM_PREFIX):
        return None
    return next((m for m in catalogue() if m.name == name), None)
