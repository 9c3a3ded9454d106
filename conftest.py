"""Shared pytest setup: hypothesis profiles and the vLLM availability gate.

Profiles (select with ``--hypothesis-profile NAME``):

* ``ci``      -- the default under ``CI=true``: derandomized, 250 streams per
                 property (1,500 in all), so ``pytest -k conformance`` fits in CI.
* ``dev``     -- the default locally: fewer examples, random seeds.
* ``nightly`` -- tens of thousands of streams, random, with the example
                 database so a failure found once is replayed first next time.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, Phase, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("ci", max_examples=250, derandomize=True, deadline=None,
                          database=None, suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("nightly", max_examples=5000, deadline=None, derandomize=False,
                          suppress_health_check=_SLOW_OK, print_blob=True,
                          phases=list(Phase))
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


def vllm_missing_reason() -> str | None:
    """Why the vLLM tier cannot run here, or None when it can."""
    if os.environ.get("HARNESS_NO_VLLM") == "1":
        return "HARNESS_NO_VLLM=1: vLLM tier switched off"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed in this environment (pip install -e '.[vllm]'); the replay tier still runs"
    return None


def pytest_collection_modifyitems(config, items):
    reason = vllm_missing_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "needs_vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_engine():
    """One VllmEngine per test process (importing vLLM takes ~10 s)."""
    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    from harness.engines import get_engine
    return get_engine("vllm")


@pytest.fixture(scope="session", autouse=True)
def _mutant_from_environment():
    """HARNESS_MUTANT=<name> runs the whole suite against one mutant, to watch it fail."""
    name = os.environ.get("HARNESS_MUTANT")
    if not name:
        yield
        return
    from harness.mutants import find
    mutant = find(name)
    if mutant is None or mutant.patch is None:
        raise pytest.UsageError(f"HARNESS_MUTANT: unknown mutant {name!r}")
    with mutant.patch():
        yield
